"""The warm stage runner (``flows/warm_runner.py`` starts it and hands it stages): import everything a stage
imports, then fork a session for each stage a command hands over, which forks the stage and reports its status.

    python -m flows.warm_server SOCKET
"""

import contextlib
import importlib
import io
import json
import os
import select
import signal
import socket
import sys
import threading

from flows.cli import main, quiet_libraries
from flows.launch import interrupted
from flows.warm_runner import FORWARDED_SIGNALS, HEADER, STATUS, import_time_environment, read_exactly
from tasks.kinds import stage_kinds

_POLL_SECONDS = 0.05  # how soon a session sees its stage end


def serve(path: str) -> None:
    """The runner: import everything a stage imports, then fork a session for each request on the socket ``path``
    until the process that started it is gone."""
    environment, parent = dict(os.environ), os.getppid()
    # numpy's import starts its BLAS thread pool (a thread per core unless OMP_NUM_THREADS says 1), which parks itself
    # across a fork: counted before the other imports, so that only threads a fork would lose refuse the runner
    importlib.import_module("numpy")
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
        (size,) = HEADER.unpack(message[: HEADER.size])
        payload = message[HEADER.size :] + read_exactly(connection, size - len(message) + HEADER.size)
        request = json.loads(payload)
        warm = _forks_as_cold(request, environment)
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


def _forks_as_cold(request: dict, environment: dict[str, str]) -> bool:
    """Whether a stage forked from this runner would run as the request's own process would: the same Python
    environment, and the same values of what the imported libraries read from the environment once."""
    same_imports = import_time_environment(request["env"]) == import_time_environment(environment)
    return request["prefix"] == sys.prefix and same_imports


def _session(connection: socket.socket, request: dict, fds: list[int]) -> None:
    """Fork the stage, pass it the signals the command forwards, kill its process group if the command is gone,
    and send the command its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # A signal to the runner's whole process group (`timeout alignflow repro`, Ctrl-C in a terminal) reaches this
    # session too: it stays to report the stage's end. The command's client, in that group as well, forwards the
    # signal over the connection once, and the stage (in a group of its own) gets it from there.
    for number in FORWARDED_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
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
                connection.sendall(STATUS.pack(os.waitstatus_to_exitcode(status)))
            os._exit(0)
        if not ready:
            continue
        try:
            received = connection.recv(16)
        except ConnectionResetError:
            received = b""
        for number in received or bytes([signal.SIGKILL]):
            _signal_group(stage, number)
        if not received:  # the command is gone
            os.waitpid(stage, 0)
            os._exit(0)


def _signal_group(stage: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(stage, number)


def _run_stage(request: dict, fds: list[int]) -> None:
    """Become the command: its streams, directory, environment and argv; then what ``alignflow`` runs."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # what a process of its own starts with
    for number in FORWARDED_SIGNALS:
        if number != signal.SIGINT:
            signal.signal(number, signal.SIG_DFL)
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
    try:
        status = main(request["argv"])
    except KeyboardInterrupt:  # as the command run cold says it: one line, not a traceback
        status = interrupted(request["argv"])
    raise SystemExit(status)


def _preload() -> None:
    """Every module a stage imports: the command line, the stages' entry modules and the model classes."""
    quiet_libraries()  # what a stage sets before huggingface_hub reads it, once, at import
    for kind in stage_kinds().values():
        importlib.import_module(kind.entry.partition(":")[0])
    for module in ("tasks.params.load", "tasks.params.rules", "transformers.models.llama.modeling_llama", "peft"):
        importlib.import_module(module)


def _threads() -> int:
    """The process's native threads (on Linux; elsewhere 1)."""
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


if __name__ == "__main__":
    serve(sys.argv[1])
