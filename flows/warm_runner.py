"""A warm stage runner: one process that has imported torch, transformers and every stage once, and forks a child
for each ``alignflow stage`` that ``alignflow repro`` runs, instead of each stage process paying those imports
(about 5 s of a stage's 10-15 s when its work is a few steps).

``alignflow repro`` starts the runner (``started``) and names its socket in ``ALIGNFLOW_WARM_RUNNER`` for the
stages DVC runs. A stage's command (``alignflow stage NAME``, ``flows/launch.py``) hands its argv, working directory,
environment and standard streams to the runner (``run_warm``) and waits; the runner forks a session, the session
forks the stage, which runs exactly what a cold ``alignflow stage`` runs, and the session returns the stage's exit
status. The command then exits with it (or dies of the same signal). A stage runs cold, as its own process, when
no runner is ready yet, when its environment differs from the runner's in a variable that libraries read at import
(threads, devices, Hugging Face settings), or when it runs in another Python environment. The bits do not depend
on it: a forked stage has every module the cold one would import and no state of another stage's (the runner runs
none).

- SIGINT, SIGTERM and SIGHUP sent to the command reach the stage's process group; a command killed outright
  (``kill -9``) takes the stage's process group with it, as its socket closes.
- The runner stops with ``alignflow repro`` (or on its own when that process is gone).
- ``ALIGNFLOW_WARM_RUNNER=off`` runs every stage cold.

Only the standard library is imported here: the command that hands a stage over must stay light.
"""

import contextlib
import importlib
import io
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator

ENV_VAR = "ALIGNFLOW_WARM_RUNNER"
OFF = "off"
# Environment variables that libraries the runner has imported read once, at import or at their first use: a stage
# that asks for other values than the runner started with runs cold.
IMPORT_TIME_PREFIXES = (
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "KMP_",
    "GOMP_",
    "CUDA_",
    "NVIDIA_",
    "TORCH",
    "PYTORCH_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "PYTHON",
    "LD_",
    "MALLOC_",
    "RAY_",
    "VLLM_",
    "PREFECT_",
)
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_STATUS = struct.Struct("!i")
_HEADER = struct.Struct("!Q")
_POLL_SECONDS = 0.05  # how soon a session sees its stage end


def import_time_environment(environment: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in environment.items() if key.startswith(IMPORT_TIME_PREFIXES)}


@contextlib.contextmanager
def started() -> Iterator[str | None]:
    """A warm runner for the stages run inside this block (their environment names it), and the path of its log (a
    line for each stage it ran: ``<pid> alignflow stage ...``, or ``cold alignflow stage ...``); none if one is
    already named or ``ALIGNFLOW_WARM_RUNNER=off``. Stopped, and its socket and log removed, on leaving."""
    if os.environ.get(ENV_VAR):
        yield None
        return
    directory = tempfile.mkdtemp(prefix="alignflow-runner-")
    path = os.path.join(directory, "socket")
    log_path = os.path.join(directory, "runner.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "flows.warm_runner", path],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    os.environ[ENV_VAR] = path
    try:
        yield log_path
    finally:
        os.environ.pop(ENV_VAR, None)
        process.terminate()
        process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def run_warm(argv: list[str]) -> int | None:
    """Run ``alignflow argv`` in a child of the warm runner: its exit status, or None when it should run cold."""
    path = os.environ.get(ENV_VAR)
    if not path or path == OFF:
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:  # no runner yet (it is importing), or none any more
        connection.close()
        return None
    request = {"argv": argv, "program": sys.argv[0], "cwd": os.getcwd(), "env": dict(os.environ)}
    request["prefix"] = sys.prefix  # the environment's packages: its site-packages, its alignflow
    payload = json.dumps(request).encode()
    message = _HEADER.pack(len(payload)) + payload
    sent = socket.send_fds(connection, [message], [0, 1, 2])
    connection.sendall(message[sent:])
    if _read_exactly(connection, 1) != b"w":
        connection.close()
        return None
    for number in _FORWARDED:
        signal.signal(number, lambda number, frame: connection.sendall(bytes([number])))
    status = _read_exactly(connection, _STATUS.size)
    if len(status) < _STATUS.size:
        print("alignflow: error: the warm runner's session ended without the stage's status", file=sys.stderr)
        return 1
    (code,) = _STATUS.unpack(status)
    if code < 0:  # the stage died of a signal: so does this command, as DVC would have seen of a cold stage
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _read_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def serve(path: str) -> None:
    """The runner: import everything a stage imports, then fork a session for each request on the socket ``path``
    until the process that started it is gone."""
    environment, parent = dict(os.environ), os.getppid()
    import numpy  # noqa: F401 (its BLAS starts its thread pool at import, and parks it across a fork)

    blas_threads = _threads()
    _preload()
    # A fork copies only the calling thread: a thread any other import started would be missing in the stage.
    if threading.active_count() != 1 or _threads() != blas_threads:
        print(f"warm runner: {_threads()} threads after the imports; every stage runs cold", flush=True)
        return
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # sessions are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{path}.binding")
    listener.listen(64)
    os.rename(f"{path}.binding", path)  # clients see a socket only once it accepts
    print("ready", flush=True)
    listener.settimeout(1.0)
    runner = os.getpid()
    while os.getppid() == parent:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            continue
        connection.settimeout(None)
        message, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
        (size,) = _HEADER.unpack(message[: _HEADER.size])
        payload = message[_HEADER.size :] + _read_exactly(connection, size - len(message) + _HEADER.size)
        request = json.loads(payload)
        warm = request["prefix"] == sys.prefix and import_time_environment(request["env"]) == import_time_environment(
            environment
        )
        if warm and os.fork() == 0:
            listener.close()
            _session(connection, request, fds)  # raises SystemExit in the stage's process, exits in the session's
        if not warm:
            print(f"cold alignflow {' '.join(request['argv'])}", flush=True)
            connection.sendall(b"c")
        connection.close()
        for fd in fds:
            os.close(fd)
        assert os.getpid() == runner


def _session(connection: socket.socket, request: dict, fds: list[int]) -> None:
    """Fork the stage, pass it the signals the command forwards, kill its process group if the command is gone,
    and send the command its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    connection.sendall(b"w")
    stage = os.fork()
    if stage == 0:
        connection.close()
        _run_stage(request, fds)
    os.setpgid(stage, stage)  # as the stage does: whichever runs first
    print(f"{stage} alignflow {' '.join(request['argv'])}", flush=True)
    for fd in fds:
        os.close(fd)
    while True:
        ready, _, _ = select.select([connection], [], [], _POLL_SECONDS)
        ended, status = os.waitpid(stage, os.WNOHANG)
        if ended:
            with contextlib.suppress(OSError):
                connection.sendall(_STATUS.pack(os.waitstatus_to_exitcode(status)))
            os._exit(0)
        if not ready:
            continue
        received = connection.recv(16)
        with contextlib.suppress(ProcessLookupError):
            for number in received or bytes([signal.SIGKILL]):
                os.killpg(stage, number)
        if not received:  # the command is gone
            os.waitpid(stage, 0)
            os._exit(0)


def _run_stage(request: dict, fds: list[int]) -> None:
    """Become the command: its streams, directory, environment and argv; then what ``alignflow`` runs."""
    os.setpgid(0, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # the streams Python gives a process of its own: stdout line-buffered on a terminal, stderr always, both
    # unbuffered under PYTHONUNBUFFERED
    write_through = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), line_buffering=os.isatty(1), write_through=write_through
    )
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        errors="backslashreplace",
        line_buffering=True,
        write_through=write_through,
    )
    sys.argv = [request["program"], *request["argv"]]
    from flows.cli import main

    raise SystemExit(main(request["argv"]))


def _preload() -> None:
    """Every module a stage imports: the command line, the stages' entry modules and the model classes."""
    from flows.cli import _quiet_libraries
    from tasks.kinds import stage_kinds

    _quiet_libraries()  # what a stage sets before huggingface_hub reads it, once, at import
    for kind in stage_kinds().values():
        importlib.import_module(kind.entry.partition(":")[0])
    for module in ("tasks.params.load", "tasks.params.rules", "transformers.models.llama.modeling_llama", "peft"):
        importlib.import_module(module)


def _threads() -> int:
    """The process's native threads (on Linux; elsewhere 1)."""
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


if __name__ == "__main__":
    serve(sys.argv[1])
