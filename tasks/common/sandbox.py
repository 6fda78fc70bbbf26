"""A spawned process that runs code of the user's (reward functions, tools, environments) out of the caller's way.

The caller sends one request at a time and waits at most a time budget for the answer: a request that overruns it
gets its process killed (the next call starts a fresh one), and one whose process dies (a segfault, ``os._exit``)
is reported as such, so user code can neither hang nor crash a run, only fail its own call.
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
    """A spawned process answering requests with ``setup(*args)``'s handler; ``setup`` must be a module-level
    function (it is pickled by reference), and the handler should catch its own errors into its answers."""

    STARTUP_SECONDS = 120.0

    def __init__(self, setup: Callable[..., Handler], args: tuple = ()):
        # spawn, not fork: the caller holds torch threads that a forked child must not inherit
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(setup, args, child), daemon=True)
        self.process.start()
        child.close()
        try:
            ready = self.connection.poll(self.STARTUP_SECONDS) and self.connection.recv() == "ready"
        except EOFError:  # it died building the handler (importing user code); its traceback is on stderr
            ready = False
        if not ready:
            self.kill()
            raise RuntimeError(f"the sandbox process of {setup.__qualname__} did not start")

    def call(self, request: Any, timeout: float) -> tuple[bool, Any]:
        """(True, the handler's answer), or (False, None) when it ran out of time: the process is then killed and
        this sandbox is spent. SandboxDied if the process died."""
        try:
            self.connection.send(request)
            if self.connection.poll(timeout):
                return True, self.connection.recv()
        except (EOFError, OSError):
            self.kill()
            raise SandboxDied(self.process.exitcode) from None
        if not self.process.is_alive():
            raise SandboxDied(self.process.exitcode)
        self.kill()
        return False, None

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
