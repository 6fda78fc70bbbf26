"""The one place alignflow uses a dvclive name that is not public API, pinned to the version it was written for.

dvclive's ``Live`` opens the project's DVC repository (and its git packs) and never closes it; left to the
interpreter's shutdown after a failed stage, dulwich's pack finalisers print a traceback each. No public method
closes it. ``tests/test_house.py`` fails when the installed dvclive is not ``PINNED`` or the attribute moved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dvclive import Live

PINNED = "3.49.1"  # pyproject.toml's dvclive pin: revisit this module when that changes


def close_repo(live: Live) -> None:
    """Close the DVC repository ``live`` opened, if it opened one."""
    if live._dvc_repo is not None:
        live._dvc_repo.close()


def opened_repo(live: Live) -> object | None:
    """The repository ``live`` holds open (for the test that pins this adapter)."""
    return live._dvc_repo
