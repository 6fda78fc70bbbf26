"""Errors a stage stops with; the command line prints their message, which names the key, file or step. And
warnings: what is legal but likely not meant, said once."""

import sys


class NonFiniteError(RuntimeError):
    """A training quantity (loss, gradient norm, reward) is inf or nan: the stage stops before it can poison the
    weights, writes no output and keeps its last checkpoint."""


class MissingUpstreamError(ValueError):
    """A stage's input is not there: the message names the stage that makes it."""


class StageBusyError(ValueError):
    """The stage is already running in this project: two runs would write the same outputs."""


def cause(error: BaseException) -> str:
    """The message of the error a Ray actor raised (Ray wraps it, with the remote traceback), or of ``error``."""
    return str(getattr(error, "cause", error))


_WARNED: set[str] = set()


def warn(message: str) -> None:
    """Say ``message`` on stderr, once per process (params, say, are read more than once)."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"alignflow: warning: {message}", file=sys.stderr)
