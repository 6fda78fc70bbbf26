"""`alignflow run` with an `alignflow serve` of the project up: the run executes inside the serve's process (no
process of its own, no import paid again), the client stays light and prints what a run in its own process prints,
a failure or a cancel ends it as there, and without a serve it runs in its own process (a minute or two)."""

import json
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from filelock import FileLock
from omegaconf import OmegaConf

from flows.local_server import local_prefect_server
from flows.pipelines import RUN_LOCK
from tasks.params.load import load_params
from tests.conftest import ENV, dvc
from tests.serving import api, deployments, serving, wait_until

pytestmark = pytest.mark.slow

# A served run's own process, as Prefect's runner would start one: `python -m prefect.engine`, or a spawned child.
_RUN_PROCESS = ("prefect.engine", "multiprocessing.spawn", "spawn_main")


def _copy(project: Path, to: Path) -> Path:
    """A copy of a built project (every stage up to date), pushing to a remote of its own."""
    shutil.copytree(project, to, symlinks=True)
    params = OmegaConf.load(to / "params.yaml")
    OmegaConf.update(params, "remote.url", str(to / ".alignflow/remote"))
    OmegaConf.save(params, to / "params.yaml")
    return to


@pytest.fixture(scope="module")
def served(uninterrupted, prefect_env, tmp_path_factory) -> Iterator[tuple[Path, subprocess.Popen, dict]]:
    """`alignflow serve` up in a copy of the tiny sft pipeline built by `dvc repro`."""
    home = tmp_path_factory.mktemp("served")
    project = _copy(uninterrupted["path"], home / "project")
    with serving(project, prefect_env, home / "serve.log") as serve:
        yield project, serve, prefect_env


def alignflow(project: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["alignflow", *args], cwd=project, env=env, capture_output=True, text=True, timeout=600)


# What a run needs that the client must not import: the flows, Prefect, DVC's repository, Ray (the params'
# validation may read a light module of DVC's).
_RUN_NEEDS = {"flows.pipelines", "prefect", "dvc.repo", "ray"}


def _imported(stderr: str) -> set[str]:
    """The modules a process imported, from its ``-X importtime`` lines."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def _runs(env: dict, deployment: str) -> list[dict]:
    (found,) = [d for d in deployments(env) if d["name"] == deployment]
    return api(
        env, "/flow_runs/filter", {"deployments": {"id": {"any_": [found["id"]]}}, "sort": "EXPECTED_START_TIME_DESC"}
    )


class _Spawns(threading.Thread):
    """Every process below ``root`` that looks like a flow run's own process, seen while watching."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root, self.stop, self.seen = psutil.Process(root), threading.Event(), set()

    def run(self) -> None:
        while not self.stop.is_set():
            for process in self.root.children(recursive=True):
                try:
                    cmdline = " ".join(process.cmdline())
                except psutil.Error:
                    continue
                if any(marker in cmdline for marker in _RUN_PROCESS):
                    self.seen.add(cmdline)
            time.sleep(0.02)


def test_alignflow_run_executes_in_the_serve_process_and_prints_what_a_run_of_its_own_prints(served):
    project, serve, env = served
    before = len(_runs(env, "sft"))
    watcher = _Spawns(serve.pid)
    watcher.start()
    try:
        results = [alignflow(project, {**env, "PYTHONPROFILEIMPORTTIME": "1"}, "run", "sft") for _ in range(2)]
    finally:
        watcher.stop.set()
        watcher.join()
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        # The run's log lines and report come back: every stage up to date, skipped; the report as `alignflow
        # report` prints it.
        assert result.stderr.count("is up to date: skipped") == 5, result.stderr[-3000:]
        assert "Finished in state Completed()" in result.stderr
        # The client imported none of what the run needs: Prefect, DVC, Ray and the flows are the serve's.
        assert not _imported(result.stderr) & _RUN_NEEDS, _imported(result.stderr) & _RUN_NEEDS
    assert results[0].stdout == results[1].stdout == alignflow(project, ENV, "report").stdout
    assert not watcher.seen, f"a served run started a process of its own: {watcher.seen}"
    runs = _runs(env, "sft")
    assert len(runs) == before + 2 and all(run["state"]["type"] == "COMPLETED" for run in runs[:2])
    # Prefect records where each ran: the serve's process.
    assert {run["infrastructure_pid"] for run in runs[:2]} == {f"{socket.gethostname()}:{serve.pid}"}


def test_a_run_created_through_the_api_executes_in_the_serve_process(served):
    """What the UI's Run button and a schedule do: a flow run of the deployment, which the serve polls for."""
    project, serve, env = served
    (deployment,) = [d for d in deployments(env) if d["name"] == "sft"]
    run = api(env, f"/deployments/{deployment['id']}/create_flow_run", {"parameters": {"params": {"eval": {"k": 2}}}})

    def finished() -> bool:
        return api(env, f"/flow_runs/{run['id']}")["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED")

    wait_until(finished, 120, "the flow run created through the API")
    done = api(env, f"/flow_runs/{run['id']}")
    assert done["state"]["type"] == "COMPLETED", (project / ".." / "serve.log").read_text()[-3000:]
    assert done["infrastructure_pid"] == f"{socket.gethostname()}:{serve.pid}"


def test_a_key_that_is_no_param_is_refused_naming_it_and_another_pipelines_is_written_as_repro_writes_it(served):
    """`alignflow run sft` with an overlay written for every pipeline (examples/smollm2.args): a key no stage reads is
    refused before anything runs; a param of a stage sft does not run goes into params.yaml, as `alignflow repro`
    writes it, and the run runs."""
    project, _, env = served
    before, params_before = len(_runs(env, "sft")), (project / "params.yaml").read_bytes()
    result = alignflow(project, env, "run", "sft", "ppo.nosuch=3")
    assert result.returncode == 2
    assert "ppo.nosuch" in result.stderr and len(_runs(env, "sft")) == before
    try:
        result = alignflow(project, env, "run", "sft", "ppo.steps=3")
        assert result.returncode == 0, result.stderr[-3000:]
        assert "alignflow: params.yaml updated with ppo.steps=3" in result.stderr
        assert load_params(project / "params.yaml").ppo.steps == 3
        assert len(_runs(env, "sft")) == before + 1
    finally:  # the module's other tests share the project
        (project / "params.yaml").write_bytes(params_before)


def _replace_command(project: Path, stage: str, command: str) -> str:
    """Make ``stage`` run ``command`` instead of ``alignflow stage <stage>``; dvc.yaml's text as it was."""
    dvc_yaml = project / "dvc.yaml"
    text = dvc_yaml.read_text()
    dvc_yaml.write_text(text.replace(f"cmd: alignflow stage {stage}\n", f"cmd: {command}\n"))
    return text


def test_a_failing_stage_fails_the_served_run_with_its_error(served):
    project, _, env = served
    (project / "fail.py").write_text("import sys\nsys.exit(3)\n")
    original = _replace_command(project, "base", "python fail.py && alignflow stage base")
    try:
        result = alignflow(project, env, "run", "sft")
    finally:
        (project / "dvc.yaml").write_text(original)
        (project / "fail.py").unlink()
    assert result.returncode == 1, result.stderr[-3000:]
    assert "alignflow: error: StageFailed: stage 'base' exited with status 3" in result.stderr
    assert _runs(env, "sft")[0]["state"]["type"] == "FAILED"


def _sleeping(project: Path) -> psutil.Process | None:
    for process in psutil.process_iter(["cmdline", "cwd"]):
        if process.info["cwd"] == str(project) and process.info["cmdline"] == ["sleep", "600"]:
            return process
    return None


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("how", ["ctrl-c", "prefect"])
def test_a_cancelled_served_run_stops_its_stage_and_ends_cancelled(served, how):
    """Ctrl-C on the `alignflow run` following the run, or a cancel in Prefect (the UI's): the stage's process is
    killed, the run ends Cancelled, and the serve goes on to the next run."""
    project, serve, env = served
    original = _replace_command(project, "base", "sleep 600 && alignflow stage base")
    try:
        client = subprocess.Popen(
            ["alignflow", "run", "sft"],
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_sigint_as_in_a_terminal,
        )
        wait_until(lambda: _sleeping(project) or client.poll() is not None, 120, "the base stage to start")
        stage = _sleeping(project)
        assert stage is not None, client.communicate()
        if how == "ctrl-c":
            client.send_signal(signal.SIGINT)
        else:
            run = _runs(env, "sft")[0]
            api(env, f"/flow_runs/{run['id']}/set_state", {"state": {"type": "CANCELLING"}, "force": True})
        gone, alive = psutil.wait_procs([stage], timeout=60)
        assert gone and not alive, "the stage process outlived the cancelled run"
        _, stderr = client.communicate(timeout=60)
    finally:
        (project / "dvc.yaml").write_text(original)
    assert client.returncode == (130 if how == "ctrl-c" else 1), stderr[-3000:]
    assert "alignflow: error: the run was cancelled" in stderr
    assert _runs(env, "sft")[0]["state"]["type"] == "CANCELLED"
    assert serve.poll() is None
    after = alignflow(project, env, "run", "sft")  # the serve runs the next one
    assert after.returncode == 0 and after.stderr.count("is up to date: skipped") == 5, after.stderr[-3000:]


def test_stopping_the_serve_cancels_its_run_and_leaves_the_project_as_the_run_found_it(uninterrupted, tmp_path):
    """SIGTERM (as Ctrl-C) to `alignflow serve` while a run's stage has landed its outputs but not exited: the serve
    exits 0 and the run ends cancelled; params.yaml holds its bytes from before the run (neither the run's override
    nor DVC's rewrite of every null), the run lock is free, and dvc.lock tells the truth about base's outputs."""
    project = _copy(uninterrupted["path"], tmp_path / "project")
    before = (project / "params.yaml").read_bytes()
    assert b": null\n" in before
    _replace_command(project, "base", "alignflow stage base && sleep 600")
    # A Prefect server of its own: the module's other serve polls the shared one for the same deployments' runs.
    with (
        local_prefect_server(tmp_path / "prefect-home", ENV) as prefect_env,
        serving(project, prefect_env, tmp_path / "serve.log") as serve,
    ):
        client = subprocess.Popen(
            ["alignflow", "run", "sft", "base.num_layers=2"],
            cwd=project,
            env=prefect_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: _sleeping(project) or client.poll() is not None, 120, "base to land its outputs")
        assert _sleeping(project) is not None, client.communicate()
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0, (tmp_path / "serve.log").read_text()[-3000:]
        # the client hears of the cancel when its stream ends: on a loaded machine, more than a minute later
        _, stderr = client.communicate(timeout=240)
    assert client.returncode == 1, stderr[-3000:]
    assert "alignflow: error: the run was cancelled: alignflow serve stopped" in stderr
    assert _sleeping(project) is None
    assert (project / "params.yaml").read_bytes() == before
    FileLock(project / RUN_LOCK).acquire(timeout=0)  # Timeout if anything still held it
    # base's outputs are those dvc.lock records: recorded as they landed, or put back
    status = json.loads(dvc(project, "status", "--json", "base"))
    assert not [entry for entry in status.get("base", []) if "changed outs" in entry], status


def test_without_a_serve_alignflow_run_runs_in_its_own_process(uninterrupted, prefect_env, tmp_path):
    project = _copy(uninterrupted["path"], tmp_path / "project")
    result = alignflow(project, {**prefect_env, "PYTHONPROFILEIMPORTTIME": "1"}, "run", "sft")
    assert result.returncode == 0, result.stderr[-3000:]
    assert {"prefect", "dvc.repo", "ray"} <= _imported(result.stderr)  # (the flows are imported on another thread)
    assert result.stderr.count("is up to date: skipped") == 5
    assert result.stdout == alignflow(project, ENV, "report").stdout


def test_a_healthy_run_with_prefects_own_temporary_server_prints_no_error(uninterrupted, tmp_path):
    """No PREFECT_API_URL: the flow run starts Prefect's temporary server, whose usage telemetry, reaching for the
    network, logged an ERROR on every run."""
    project = _copy(uninterrupted["path"], tmp_path / "project")
    env = {key: value for key, value in ENV.items() if not key.startswith("PREFECT_")}
    result = alignflow(project, {**env, "PREFECT_HOME": str(tmp_path / "prefect-home")}, "run", "sft")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("is up to date: skipped") == 5
    assert "ERROR" not in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]
