import atexit
import contextlib
import functools
import hashlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml
from omegaconf import OmegaConf

from flows import warm_runner
from flows.cli import COMMAND_ENVIRONMENT, LIBRARY_ENVIRONMENT
from flows.fingerprints import SOURCES_STAGE
from tasks.pipelines import PIPELINES

REPO = Path(__file__).resolve().parents[1]

# Under `pytest -n N` the test processes share the cores, and each one's torch (and every stage it starts, which
# inherits this) would otherwise take all of them: on 2 cores, two pipeline test files side by side took 214 s
# with 2 threads each and 163 s with 1 (docs/testing.md).
if (_workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // _workers))


# The longest test files, longest first (as measured by a full run, docs/testing.md): under `pytest -n 2` a file runs
# whole on one process, which holds two files at a time, and the file that starts last sets when the run ends.
LONGEST_FIRST = (
    "test_real_model.py",
    "test_retrain.py",
    "test_flows.py",
    "test_data_parallel.py",
    "test_serve.py",
    "test_served_runs.py",
    "test_r1_pipeline.py",
    "test_async_rollouts.py",
    "test_offline_to_online.py",
    "test_warm_runner.py",
    "test_distill_pipeline.py",
    "test_agent_pipeline.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))  # stable: the rest keep their order


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """An empty working directory holding the repo's params.yaml and an empty data/, as a stage sees it."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def produced(project: Path) -> list[str]:
    """What a stage left in ``project`` besides its params, its data/ and a bad.jsonl a test wrote there."""
    return sorted(p.name for p in project.iterdir() if p.name not in ("params.yaml", "bad.jsonl", "data"))


TINY = [line for line in (REPO / "examples/tiny.args").read_text().splitlines() if line and line[0] != "#"]
# What a command and a stage set in their environment (flows.cli), set before ENV is taken and the warm runner
# starts: a command's stage forks from the runner only when the variables its imports read agree.
for _key, _value in {**COMMAND_ENVIRONMENT, **LIBRARY_ENVIRONMENT}.items():
    os.environ.setdefault(_key, _value)
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture(scope="module")
def prefect_env(tmp_path_factory):
    """A Prefect server (SQLite) on 127.0.0.1, one per test module, and the environment pointing clients at it."""
    from flows.local_server import local_prefect_server

    with local_prefect_server(tmp_path_factory.mktemp("prefect-home"), ENV) as env:
        yield env


def make_project(path: Path, overrides: tuple[str, ...] = ()) -> Path:
    """A git repo holding the tracked files of this one, its params shrunk to TINY (then ``overrides``)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (REPO / name).is_file():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_bytes((REPO / name).read_bytes())
    # each project pushes to a remote of its own, never to ~/.alignflow
    own_remote = f"remote.url={path.resolve() / '.alignflow/remote'}"
    dotlist = [*TINY, own_remote, *overrides]
    params = OmegaConf.merge(OmegaConf.load(path / "params.yaml"), OmegaConf.from_dotlist(dotlist))
    OmegaConf.save(params, path / "params.yaml")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=path, check=True)
    return path


def md5_tree(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` by relative path, with the md5 of its bytes."""
    import hashlib

    return {
        str(p.relative_to(directory)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in directory.rglob("*")
        if p.is_file()
    }


def stop_ray_nodes(port: int) -> None:
    """Stop the Ray nodes of the cluster at ``port`` only (``ray stop`` would stop every Ray on the machine)."""
    ours = [
        process
        for process in psutil.process_iter(["cmdline"])
        if any(str(port) in part for part in process.info["cmdline"] or [])
        and "ray" in " ".join(process.info["cmdline"])
    ]
    for process in ours:
        process.terminate()
    _, alive = psutil.wait_procs(ours, timeout=10)
    for process in alive:
        process.kill()


def _ray_head(stack: contextlib.ExitStack) -> tuple[dict[str, str], Callable[[], None]]:
    """A Ray head on loopback (``ray start --block``, configured as a stage's own local Ray) for as long as this
    test process lives; the variables that have a stage join it by address, as the stages of `alignflow run`
    join their flow's Ray, instead of starting and stopping a Ray of their own (about 4.5 s and 4 CPU-seconds of
    daemons each here, docs/testing.md); and a function that returns once the head takes drivers."""
    from flows.local_server import free_port
    from tasks.common.cluster import LOCAL_RAY

    port, home = free_port(), Path(tempfile.mkdtemp(prefix="alignflow-test-ray-"))
    log, token = home / "head.log", home / "auth_token"
    token.write_text(secrets.token_hex(32))  # the cluster's own (Ray's default, ~/.ray/auth_token, may not exist)
    joined = {"RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    head = [
        str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
        f"--port={port}", f"--num-cpus={os.cpu_count()}", "--include-dashboard=false", "--disable-usage-stats",
        f"--system-config={json.dumps(LOCAL_RAY)}",
    ]  # fmt: skip
    with log.open("wb") as output:
        process = subprocess.Popen(
            head,
            env={key: value for key, value in ENV.items() if key != "RAY_ADDRESS"} | joined,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )

    def stop() -> None:
        process.terminate()  # `ray start --block` stops the node's daemons and workers as it exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        stop_ray_nodes(port)
        shutil.rmtree(home, ignore_errors=True)

    def started(timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while b"Ray runtime started" not in log.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the tests' Ray head did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    stack.callback(stop)
    return joined, started


def _die_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the test process dies, however it dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


_warm_runner = contextlib.ExitStack()


@functools.cache
def _this_process_runner() -> tuple[dict[str, str], Path] | None:
    """This test process's warm stage runner (flows/warm_runner.py) and Ray head, started on first use: the
    variables that name them to a command, and the runner's log (a line for each stage it forks, ``<pid> alignflow
    stage ...``). Kept out of os.environ, so that what else a test starts runs as it would without them. Started
    with ENV, as the stages are: a variable a test left in os.environ (Ray's, Prefect's) would make every stage
    differ and run cold."""
    # at exit, not in a session fixture: test files import this module as tests.conftest, a module apart from the
    # conftest pytest loads, and the runner they start is this one's
    if ENV.get(warm_runner.ENV_VAR):  # one named already, or off
        return None
    atexit.register(_warm_runner.close)
    joined, ray_started = _ray_head(_warm_runner)
    current = dict(os.environ)
    os.environ.clear()
    os.environ.update({**ENV, **joined})  # the runner starts with the stages' environment, whatever tests set since
    try:
        log = _warm_runner.enter_context(warm_runner.started())
        named = {**joined, warm_runner.ENV_VAR: os.environ[warm_runner.ENV_VAR]}
    finally:
        os.environ.clear()
        os.environ.update(current)
    ray_started()  # while the runner imports
    return named, Path(log)


def warm(env: dict[str, str] = ENV) -> dict[str, str]:
    """``env`` naming this test process's warm runner and Ray: an ``alignflow stage`` or ``alignflow repro`` run
    with it (and the stages conftest's ``dvc`` runs) fork their stages from the runner instead of importing torch,
    transformers and the stages anew (most of a cold stage's 10-15 s here; `alignflow repro` would start a runner of
    its own and run its first stages cold while that one imports), and join the process's Ray. ``env`` as it is
    when no runner could start; a Ray that ``env`` names is kept (its stages then run cold)."""
    runner = _this_process_runner()
    if runner is None:
        return env
    named, _ = runner
    return {**env, **({warm_runner.ENV_VAR: named[warm_runner.ENV_VAR]} if "RAY_ADDRESS" in env else named)}


def dvc(path: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=path, env=warm(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def repro(path: Path, pipeline: str = "sft") -> str:
    """`dvc repro` of a pipeline's final stages (what `alignflow repro <pipeline>` runs)."""
    from tasks.params.load import load_params

    return dvc(path, "repro", *PIPELINES[pipeline].stages(load_params(path / "params.yaml")))


def report_json(path: Path) -> dict:
    """`alignflow report --json` of the project at ``path``."""
    import json

    result = subprocess.run(["alignflow", "report", "--json"], cwd=path, env=ENV, capture_output=True, text=True)
    return json.loads(result.stdout)


def kill_at_first_checkpoint(command: list[str], cwd: Path, checkpoints: Path) -> None:
    """Run ``command`` and SIGKILL its whole process group as soon as a checkpoint appears under ``checkpoints``;
    return once the stages it handed to the warm runner (which kills them when the command's connection closes)
    are gone too, as the stages of a command run cold are with its group."""
    runner = _this_process_runner()
    forked_before = len(runner[1].read_text().splitlines()) if runner else 0
    run = subprocess.Popen(
        command, cwd=cwd, env=warm(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while not list(checkpoints.glob("*/latest.pt")) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    for line in runner[1].read_text().splitlines()[forked_before:] if runner else []:
        pid = line.partition(" ")[0]
        if pid.isdigit():
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(int(pid)).wait(timeout=60)
    assert list(checkpoints.glob("*/latest.pt")), "no checkpoint was written before the deadline"


def resume_after_kill(stage: str, project: Path) -> str:
    """Kill ``alignflow stage <stage>`` at its first checkpoint, run it again to the end; the rerun's output."""
    checkpoints = project / ".alignflow/checkpoints" / stage
    kill_at_first_checkpoint(["alignflow", "stage", stage], project, checkpoints)
    resumed = subprocess.run(["alignflow", "stage", stage], cwd=project, env=warm(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert not checkpoints.exists(), "a finished stage leaves no checkpoint behind"
    return resumed.stdout + resumed.stderr


@pytest.fixture
def one_thread():
    """The tiny model's ops are too small to split across threads: with one thread the toy GRPO run takes about
    0.25 s; with two it took 5-25 s on 2 cores another job was also using."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(path: Path) -> Path:
    """A tiny random Llama and the character tokenizer saved in HF format at ``path``."""
    from models import build_char_tokenizer, build_tiny_llama
    from tasks.common.config import BaseConfig

    tokenizer = build_char_tokenizer()
    config = BaseConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    build_tiny_llama(config, tokenizer, 0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def lock_entries(project: Path) -> dict:
    """dvc.lock's record of every stage (cmd, deps, params, outs with their hashes), order aside."""
    return yaml.safe_load((project / "dvc.lock").read_text())["stages"]


def stages_run(output: str) -> set[str]:
    """The stages a repro ran, less ``sources``, which every repro runs (it writes the fingerprints the others
    read; ``test_model_sources.py`` and ``test_task_sources.py`` show it re-runs nothing when they did not change)."""
    return set(re.findall(r"Running stage '([^']+)'", output)) - {SOURCES_STAGE}


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> dict:
    """The tiny pipeline run once by `dvc repro`, uninterrupted: the reference other runs must equal."""
    path = make_project(tmp_path_factory.mktemp("uninterrupted"))
    output = repro(path)
    return {
        "path": path,
        "output": output,
        "lock": lock_entries(path),
        "weights": (path / "artifacts/sft/model.safetensors").read_bytes(),
    }


def run_seed() -> int:
    """A seed that changes from one test run to the next but is the same in every test process of a run: the
    processes of ``pytest -n`` each collect the tests, and must agree on their parameters."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return int(hashlib.sha256(run.encode()).hexdigest(), 16) % 2**16 if run else random.randrange(2**16)
