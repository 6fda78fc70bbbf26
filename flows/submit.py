"""`alignflow run` handing its run to the `alignflow serve` of the same project, when one is up.

`alignflow serve` listens on a Unix socket named after its project's path (Linux's abstract namespace: no file to
go stale when a serve is killed). `alignflow run` connects to it after validating its overrides: when nothing
listens, it runs the pipeline in its own process as before. Otherwise it sends the pipeline's name and its
overrides; the serve creates the flow run from the pipeline's deployment and executes it in its own process, which
has Prefect, DVC, torch and the flows imported and Ray joined already, and streams the run's log lines, then its
outcome, back. This module stays light (no Prefect, DVC, Ray or torch): the client pays only Python's start-up,
the params' validation and one local connection.

Ctrl-C (or the client's death) closes the connection's sending half: the serve cancels the run, its stages stop,
and the client exits with status 130 once the serve says the run is over (a second Ctrl-C exits at once).

The protocol is one JSON object a line. Client: ``{"run": PIPELINE, "overrides": [...]}``. Serve: any number of
``{"log": LINE}``, then one of ``{"done": REPORT}``, ``{"failed": {"type": T, "message": M}}`` or
``{"cancelled": WHY}``.
"""

import hashlib
import json
import os
import socket
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# What a served run's failure is, by the family of its error: the command line prints each as it prints the error
# raised in its own process (flows/cli.py's main).
FAMILIES = ("ConfigError", "DatasetError", "NonFiniteError", "ValueError")


def address(project: Path) -> bytes:
    """The abstract Unix socket where ``alignflow serve`` in ``project`` takes runs."""
    digest = hashlib.sha256(str(project.resolve()).encode()).hexdigest()[:32]
    return f"\0alignflow-serve-{digest}".encode()


def peer(connection: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket."""
    pid, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


def send(connection: socket.socket, message: dict[str, Any]) -> None:
    connection.sendall(json.dumps(message).encode() + b"\n")


class Lines:
    """The JSON messages arriving on a socket, one a line; None once the other end has closed it."""

    def __init__(self, connection: socket.socket):
        self.connection, self.buffer = connection, b""

    def next(self) -> dict[str, Any] | None:
        while b"\n" not in self.buffer:
            chunk = self.connection.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)


def connect(project: Path) -> socket.socket | None:
    """A connection to the ``alignflow serve`` of ``project``, run by this user; None when none is up."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(address(project))
    except (ConnectionRefusedError, FileNotFoundError):
        connection.close()
        return None
    if peer(connection)[1] != os.getuid():  # another user's process holds the name: not ours to run with
        connection.close()
        return None
    return connection


def run_served(project: Path, pipeline: str, overrides: Sequence[str]) -> int | None:
    """Run ``pipeline`` with ``overrides`` in the ``alignflow serve`` of ``project`` and follow it: its log lines on
    stderr, its report on stdout; the exit status. None when no serve is up (the caller runs it itself)."""
    connection = connect(project)
    if connection is None:
        return None
    with connection:
        send(connection, {"run": pipeline, "overrides": list(overrides)})
        return _follow(connection, peer(connection)[0])


def _follow(connection: socket.socket, pid: int) -> int:
    lines, interrupted = Lines(connection), False
    while True:
        try:
            message = lines.next()
        except KeyboardInterrupt:
            if interrupted:
                raise
            interrupted = True
            print(f"alignflow: cancelling the run in alignflow serve (pid {pid})", file=sys.stderr, flush=True)
            connection.shutdown(socket.SHUT_WR)  # the serve takes it as the cancel
            continue
        if message is None:
            print(f"alignflow: error: alignflow serve (pid {pid}) stopped during the run", file=sys.stderr)
            return 1
        if "log" in message:
            print(message["log"], file=sys.stderr, flush=True)
        elif "done" in message:  # (interrupted or not: the run had finished)
            print(message["done"], flush=True)
            return 0
        elif "cancelled" in message:
            print(f"alignflow: error: the run was cancelled: {message['cancelled']}", file=sys.stderr)
            return 130 if interrupted else 1
        elif "failed" in message:
            return _failed(message["failed"]["type"], message["failed"]["message"])


def _failed(family: str, message: str) -> int:
    """Raise the error a served run failed with as the command line's own (so it prints it, with its status, as
    it prints it from a run in its own process); the status for any other."""
    if family == "ConfigError":
        from tasks.common.config import ConfigError

        raise ConfigError(message)
    if family == "DatasetError":
        from tasks.data.datasets import DatasetError

        raise DatasetError(message)
    if family == "NonFiniteError":
        from tasks.common.errors import NonFiniteError

        raise NonFiniteError(message)
    if family == "ValueError":
        raise ValueError(message)
    print(f"alignflow: error: {message}", file=sys.stderr)
    return 1
