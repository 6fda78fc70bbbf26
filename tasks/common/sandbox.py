"""A spawned process that runs code of the user's (reward functions, tools, environments) out of the caller's way.

The caller sends one request at a time and waits at most a time budget for the answer: a request that overruns it
gets its process killed, and one whose process dies (a segfault, ``os._exit``) is reported as such; either way
the next call starts a fresh process. User code can neither hang nor crash a run, only fail its own call.
"""

import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

Handler = Callable[[Any], Any]


class SandboxDied(RuntimeError):
    """The sandbox process exited while serving a request."""


def _serve(setup: Callable[..., Handler], args: tuple, connection: Connection) -> None:
    """The sandbox process: build the handler once (imports paid once), then answer requests as they come."""
    handler = setup(*args)
    connection.send("ready")
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        connection.send(handler(request))


class Sandbox:
    """A process answering requests with ``setup(*args)``'s handler, started on the first call and again on the
    first call after one that killed it (it overran its time, or died); ``setup`` must be a module-level function
    (it is pickled by reference), and the handler should catch its own errors into its answers."""

    STARTUP_SECONDS = 120.0

    def __init__(self, setup: Callable[..., Handler], args: tuple = ()):
        self.setup, self.args = setup, args
        self.process: multiprocessing.process.BaseProcess | None = None
        self.connection: Connection | None = None

    @property
    def running(self) -> bool:
        """Whether a process is up: False before the first call, and after a call that lost it."""
        return self.process is not None

    def start(self) -> None:
        """Start the process, unless one is running."""
        if self.running:
            return
        # spawn, not fork: the caller holds torch threads that a forked child must not inherit
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(self.setup, self.args, child), daemon=True)
        self.process.start()
        child.close()
        try:
            ready = self.connection.poll(self.STARTUP_SECONDS) and self.connection.recv() == "ready"
        except EOFError:  # it died building the handler (importing user code); its traceback is on stderr
            ready = False
        if not ready:
            self.close()
            raise RuntimeError(f"the sandbox process of {self.setup.__qualname__} did not start")

    def call(self, request: Any, timeout: float) -> tuple[bool, Any]:
        """(True, the handler's answer), or (False, None) when it ran out of time: the process is then killed, and
        the next call starts a fresh one. SandboxDied if the process died (likewise replaced on the next call)."""
        self.start()
        try:
            self.connection.send(request)
            if self.connection.poll(timeout):
                return True, self.connection.recv()
        except (EOFError, OSError):
            code = self.close()
            raise SandboxDied(code) from None
        if not self.process.is_alive():
            raise SandboxDied(self.close())
        self.close()
        return False, None

    def close(self) -> int | None:
        """Stop the process, if one runs; its exit code."""
        if self.process is None:
            return None
        process, self.process, self.connection = self.process, None, None
        process.kill()
        process.join()
        return process.exitcode

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
