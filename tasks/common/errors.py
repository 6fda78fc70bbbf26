"""Errors a stage stops with; the command line prints their message, which names the key, file or step."""


class NonFiniteError(RuntimeError):
    """A training quantity (loss, gradient norm, reward) is inf or nan: the stage stops before it can poison the
    weights, writes no output and keeps its last checkpoint."""


class MissingUpstreamError(ValueError):
    """A stage's input is not there: the message names the stage that makes it."""


def cause(error: BaseException) -> str:
    """The message of the error a Ray actor raised (Ray wraps it, with the remote traceback), or of ``error``."""
    return str(getattr(error, "cause", error))
