"""A warm stage runner, its client side. The runner is one process that has imported torch, transformers and every
stage once, and forks a child for each ``alignflow stage`` that ``alignflow repro`` runs, instead of each stage
process paying those imports (about 5 s of a stage's 10-15 s when its work is a few steps).

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

Only the standard library is imported here: the command that hands a stage over must stay light. The runner itself
is ``flows/warm_server.py``.
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
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
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STATUS = struct.Struct("!i")  # a stage's exit status, negative for the signal that ended it
HEADER = struct.Struct("!Q")  # a request's length


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
            [sys.executable, "-m", "flows.warm_server", path],
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
    message = HEADER.pack(len(payload)) + payload
    sent = socket.send_fds(connection, [message], [0, 1, 2])
    if sent < len(message):  # even an empty send fails once a runner that refused the stage has closed its end
        connection.sendall(message[sent:])
    if read_exactly(connection, 1) != b"w":
        connection.close()
        return None
    for number in FORWARDED_SIGNALS:
        signal.signal(number, lambda number, frame: _forward(connection, number))
    status = read_exactly(connection, STATUS.size)
    if len(status) < STATUS.size:
        print("alignflow: error: the warm runner's session ended without the stage's status", file=sys.stderr)
        return 1
    (code,) = STATUS.unpack(status)
    if code < 0:  # the stage died of a signal: so does this command, as DVC would have seen of a cold stage
        if -code != signal.SIGKILL:  # SIGKILL's action (the OOM killer's) is the default and cannot be set
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _forward(connection: socket.socket, number: int) -> None:
    with contextlib.suppress(OSError):  # a session already gone says so by closing: read_exactly sees that
        connection.sendall(bytes([number]))


def read_exactly(connection: socket.socket, size: int) -> bytes:
    """``size`` bytes, or fewer where the other end closed (or reset) the connection first."""
    data = b""
    while len(data) < size:
        try:
            chunk = connection.recv(size - len(data))
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data
