"""The one place alignflow uses a Prefect name that is not public API, pinned to the version it was written for.

``alignflow serve`` cancels the flow run it is executing in its own process (flows/deployments.py). Prefect's flow
engine ends a run on a termination signal as Cancelled, not Crashed, only when a runner has first committed a
"cancel" intent; its own runner does that over a socket from another process, and no public function commits it in
process. ``tests/test_house.py`` fails when the installed Prefect is not ``PINNED`` or the name moved.
"""

from prefect._internal import control_listener

PINNED = "3.7.7"  # pyproject.toml's prefect pin: revisit this module when that changes


def commit_cancel_intent() -> None:
    """Tell this process's flow engine that the termination signal about to come is a cancellation."""
    control_listener._set_intent("cancel")


def clear_intent() -> None:
    """Forget a committed intent once the run it was for has ended (the next run in this process starts clean)."""
    control_listener.clear_intent()


def committed_intent() -> str | None:
    """The intent the flow engine will read (for the test that pins this adapter)."""
    return control_listener.get_intent()
