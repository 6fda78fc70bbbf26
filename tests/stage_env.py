"""The environment a test's commands and stages run in (``ENV``), and this test process's warm stage runner and
Ray head that ``warm()`` names to them. A module of its own, not conftest's: pytest loads conftest.py as
``conftest`` and the test files import it as ``tests.conftest``, two modules, whose runners would be two."""

import atexit
import contextlib
import ctypes
import functools
import json
import os
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

from flows import warm_runner
from flows.cli import COMMAND_ENVIRONMENT, LIBRARY_ENVIRONMENT

# Under `pytest -n N` the test processes share the cores, and each one's torch (and every stage it starts, which
# inherits this) would otherwise take all of them: on 2 cores, two pipeline test files side by side took 214 s
# with 2 threads each and 163 s with 1 (docs/testing.md).
if (_workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // _workers))


# What a command and a stage set in their environment (flows.cli), set before ENV is taken and the warm runner
# starts: a command's stage forks from the runner only when the variables its imports read agree.
for _key, _value in {**COMMAND_ENVIRONMENT, **LIBRARY_ENVIRONMENT}.items():
    os.environ.setdefault(_key, _value)
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


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


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: a child between fork and exec must not load a library


def _die_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the test process dies, however it dies (prctl PR_SET_PDEATHSIG)."""
    _LIBC.prctl(1, signal.SIGTERM)


_warm_runner = contextlib.ExitStack()


@functools.cache
def _this_process_runner() -> tuple[dict[str, str], Path] | None:
    """This test process's warm stage runner (flows/warm_runner.py) and Ray head, started on first use: the
    variables that name them to a command, and the runner's log (a line for each stage it forks, ``<pid> alignflow
    stage ...``). Kept out of os.environ, so that what else a test starts runs as it would without them. Started
    with ENV, as the stages are: a variable a test left in os.environ (Ray's, Prefect's) would make every stage
    differ and run cold."""
    if ENV.get(warm_runner.ENV_VAR):  # one named already, or off
        return None
    atexit.register(_warm_runner.close)  # at exit, not in a session fixture: test files start it as fixtures do
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
