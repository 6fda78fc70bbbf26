"""The DAG as Prefect flows on Ray, against a real Prefect server on 127.0.0.1 (minutes)."""

import concurrent.futures
import json
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest
from prefect.futures import PrefectConcurrentFuture

from flows.pipelines import result_or_interrupt, stage_summary
from flows.report import stage_metrics
from flows.runner import is_up_to_date, outputs
from tests.conftest import lock_entries, make_project

pytestmark = pytest.mark.slow


def _request(url: str, payload: dict | None = None) -> tuple[int, object]:
    """POST ``payload`` (GET without one); like Prefect's own client, retry while the server answers 503."""
    data = None if payload is None else json.dumps(payload).encode()
    for _ in range(10):
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            if error.code != 503:
                return error.code, error.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return 0, None
        time.sleep(2)
    return 503, None


def _get(url: str) -> object:
    return _request(url)[1]


def _wait_until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds}s for {what}")
        time.sleep(0.5)


def run_flow(path: Path, env: dict, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["alignflow", "run", "sft", *overrides], cwd=path, env=env, capture_output=True, text=True, timeout=900
    )


def test_prefect_flow_and_dvc_repro_leave_identical_lock_hashes(uninterrupted, prefect_env, tmp_path):
    result = run_flow(make_project(tmp_path), prefect_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert lock_entries(tmp_path) == uninterrupted["lock"]
    # Every stage published its summary, and the flow its report.
    status, artifacts = _request(f"{prefect_env['PREFECT_API_URL']}/artifacts/filter", {})
    keys = {artifact["key"] for artifact in artifacts}
    assert {"data", "base", "sft", "eval-base", "eval-sft", "sft-report"} <= keys
    sft_summary = next(a for a in artifacts if a["key"] == "sft")["data"]
    assert "artifacts/sft" in sft_summary and "train/loss" in sft_summary

    again = run_flow(tmp_path, prefect_env)
    assert (
        again.returncode == 0
        and again.stdout.count("is up to date: skipped") + again.stderr.count("is up to date: skipped") == 5
    )


def test_stage_that_fails_once_succeeds_on_retry(prefect_env, tmp_path):
    project = make_project(tmp_path, ("runner.retries=1", "runner.retry_delay_seconds=0"))
    (project / "fail_once.py").write_text(
        "import pathlib, sys\n"
        "marker = pathlib.Path('.failed-once')\n"
        "if not marker.exists():\n"
        "    marker.touch()\n"
        "    sys.exit('failing on purpose')\n"
    )
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(
        dvc_yaml.read_text().replace("cmd: alignflow stage base", "cmd: python fail_once.py && alignflow stage base")
    )
    result = run_flow(project, prefect_env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "exited with status 1" in output and "Retry 1/1" in output
    assert (project / "artifacts/base/model.safetensors").is_file()


def _stage_process(project: Path, stage: str) -> psutil.Process | None:
    for process in psutil.process_iter(["cmdline", "cwd"]):
        if process.info["cwd"] == str(project) and (process.info["cmdline"] or [])[-2:] == ["stage", stage]:
            return process
    return None


def _is_warm_runner(process: psutil.Process) -> bool:
    try:
        return "flows.warm_server" in process.cmdline()
    except psutil.Error:  # a child that has ended and waits to be reaped
        return False


def _sigint_as_in_a_terminal() -> None:
    """A test run started in the background inherits SIGINT ignored (POSIX shells do that to `cmd &`), and
    Python then never raises KeyboardInterrupt; a terminal's Ctrl-C reaches a flow with SIGINT at its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# SIGHUP covers SIGTERM too: a flow's command answers a hang-up by sending itself SIGTERM (flows/launch.py).
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGHUP], ids=lambda how: how.name)
def test_ctrl_c_sigterm_or_sighup_stops_the_stage_running_on_ray(prefect_env, tmp_path, how):
    project = make_project(tmp_path, ("sft.max_steps=100000",))
    params_before = (project / "params.yaml").read_bytes()
    flow = subprocess.Popen(
        # ppo.steps: a param the run form of sft does not hold, written into params.yaml before the run
        ["alignflow", "run", "sft", "ppo.steps=3", "sft.lr=0.0002"],
        cwd=project,
        env=prefect_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_sigint_as_in_a_terminal,
    )
    try:
        _wait_until(lambda: _stage_process(project, "sft") or flow.poll() is not None, 600, "the sft stage to start")
        stage = _stage_process(project, "sft")
        # The stage runs forked from the flow's warm runner (a child of one of its sessions), as under alignflow repro:
        # the runner starts before the first stage and imports what the cold stages before sft import.
        (runner,) = [child for child in psutil.Process(flow.pid).children() if _is_warm_runner(child)]
        _wait_until(lambda: any(session.children() for session in runner.children()), 60, "sft forked from the runner")
        forked = [process for session in runner.children() for process in (session, *session.children())]
        flow.send_signal(how)
        gone, alive = psutil.wait_procs([stage, *forked], timeout=60)
        assert gone and not alive, "the stage process outlived the interrupted flow"
        assert flow.wait(timeout=120) != 0
    finally:  # a failed assertion must not leave a flow training for 100,000 steps
        if flow.poll() is None:
            flow.terminate()
            flow.wait(timeout=120)
    assert not (project / "artifacts/sft").exists()
    assert (project / "params.yaml").read_bytes() == params_before  # neither the form's override nor the other's


def test_stage_killed_mid_run_resumes_from_its_checkpoint_on_the_next_run(uninterrupted, prefect_env, tmp_path):
    project = make_project(tmp_path / "project")
    log = tmp_path / "flow.log"
    with log.open("wb") as output:
        flow = subprocess.Popen(
            ["alignflow", "run", "sft"], cwd=project, env=prefect_env, stdout=output, stderr=subprocess.STDOUT
        )
    checkpoints = project / ".alignflow/checkpoints/sft"
    # The tiny stage runs its 120 steps in well under a second: look for its first checkpoint often.
    deadline = time.monotonic() + 600
    while not list(checkpoints.glob("*/latest.pt")) and flow.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    stage = _stage_process(project, "sft")
    assert stage is not None, f"no sft process to kill at its first checkpoint; the flow printed:\n{log.read_text()}"
    stage.kill()
    assert flow.wait(timeout=300) != 0, "the flow fails when a stage is killed and no retries are left"
    assert not (project / "artifacts/sft").exists()

    result = run_flow(project, prefect_env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "sft: resuming from the checkpoint at step" in output
    assert (project / "artifacts/sft/model.safetensors").read_bytes() == uninterrupted["weights"]


def test_the_flows_dvc_reads_are_safe_on_threads_side_by_side(tmp_path):
    """Stages that finish together read DVC from several threads of the flow's process; DVC is not
    thread-safe (two loads of dvc.yaml at once fail its validation now and then), so they take turns."""
    project = make_project(tmp_path)
    errors = []

    def read(stage: str) -> None:
        for _ in range(10):
            try:
                is_up_to_date(project, stage)
                outputs(project, stage)
                stage_metrics(project, stage)
            except Exception as error:
                errors.append(error)

    threads = [threading.Thread(target=read, args=(stage,)) for stage in ("data", "base", "sft", "ppo")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]


def test_waiting_for_a_stage_yields_to_ctrl_c_that_lands_on_another_thread():
    """The kernel may hand SIGINT to any thread of the flow's process; the main thread, waiting for a stage
    that never ends, must still raise KeyboardInterrupt at once (a blocking wait slept through it)."""
    never_ends = concurrent.futures.Future()
    watchdog = threading.Timer(10, never_ends.set_result, args=(None,))  # a blocking wait wakes only then
    watchdog.start()
    threading.Timer(0.2, lambda: signal.pthread_kill(threading.get_ident(), signal.SIGINT)).start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as `alignflow run` has it in a terminal
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            result_or_interrupt(PrefectConcurrentFuture(uuid.uuid4(), never_ends))
    finally:
        signal.signal(signal.SIGINT, previous)
        watchdog.cancel()
    assert time.monotonic() - started < 3


def test_a_stage_summary_shows_its_gold_vs_proxy_curve_thinned_to_its_end():
    rows = "\n".join(f"{step}\t{step / 100:.2f}\t0.5\t0.1" for step in range(1, 46))
    summary = stage_summary("ppo", True, {"peak_gold_reward": 0.7}, {}, "step\tsqrt_kl\tgold\tproxy\n" + rows)
    assert "| step | sqrt_kl | gold | proxy |" in summary and "| peak_gold_reward | 0.7 |" in summary
    shown = [line for line in summary.splitlines() if line.startswith("| ") and line.count("|") == 5][1:]
    assert shown[0].startswith("| 1 |") and shown[-1].startswith("| 45 |")  # the first and the last iteration
    assert 15 <= len(shown) <= 21 and len(set(shown)) == len(shown)
    assert "Gold and proxy" in summary and "Gold and proxy" not in stage_summary("sft", True, {}, {})


def test_a_stage_summary_shows_a_few_episodes_as_conversations():
    turns = [
        {"role": "user", "content": "What is 347*86?"},
        {"role": "assistant", "content": '<tool_call>{"name": "calculate"}</tool_call>'},
        {"role": "tool", "content": "29842 | a\nb", "reward": 0.0},
        {"role": "assistant", "content": "<answer>29842</answer>"},
    ]
    episode = {"prompt": "What is 347*86?", "correct": True, "turns": 2, "messages": turns}
    summary = stage_summary("eval@sft_cold", True, {"pass@1": 1.0}, {}, None, [episode])
    assert "Episode: `What is 347*86?` (correct, 2 turns)" in summary
    assert '| assistant | `<tool_call>{"name": "calculate"}</tool_call>` |' in summary
    assert "| tool | `29842 \\| a` <br> `b` |" in summary  # one table row whatever the observation holds
    assert "Episode" not in stage_summary("eval@sft", True, {}, {})
