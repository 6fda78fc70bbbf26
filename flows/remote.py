"""The DVC remote where artifacts live beyond this disk, configured from params' ``remote`` section.

The section is written into ``.dvc/config`` as the default remote ``alignflow`` before every push, so a clone
checked out at any registered version names the remote it was pushed to, and ``dvc pull`` restores its bytes.
"""

import os
from pathlib import Path

from dvc.exceptions import DvcException

from flows.dag import open_repo
from tasks.common.config import RemoteConfig

REMOTE = "alignflow"


def remote_url(project: Path, cfg: RemoteConfig) -> str:
    """``cfg.url`` with a directory made absolute (relative to the project, ``~`` expanded): DVC resolves a
    relative path against .dvc/, which a clone elsewhere would not share."""
    if "://" in cfg.url:
        return cfg.url
    return os.path.abspath(os.path.join(project, os.path.expanduser(cfg.url)))


def configure(project: Path, cfg: RemoteConfig) -> None:
    """Make the params' remote the project's default DVC remote: in .dvc/config, committed with every version so a
    clone knows where its bytes are, and in .dvc/config.local, which DVC reads whichever commit it is looking at,
    so a push of every version's objects sends them all to today's remote (not to the one a version was made with)."""
    remote = {"url": remote_url(project, cfg)}
    if cfg.endpoint_url:
        remote["endpointurl"] = cfg.endpoint_url
    with open_repo(project) as repo:
        for level in ("repo", "local"):
            with repo.config.edit(level) as config:
                config["core"]["remote"] = REMOTE
                config["remote"][REMOTE] = remote


def push(project: Path, cfg: RemoteConfig) -> tuple[bool, str]:
    """Push the workspace's and every registered version's artifacts; never raises for the remote's sake.

    Returns (pushed?, "pushed N files to URL" or "push to URL failed: why"). A failed push loses nothing: every
    object stays in the local cache, and the next push (every tag's, not only the newest) sends what is missing.
    """
    configure(project, cfg)
    url = remote_url(project, cfg)
    try:
        with open_repo(project) as repo:
            count = repo.push(remote=REMOTE, all_tags=True)
    except Exception as error:  # noqa: BLE001 - each filesystem raises its own kind (botocore, OSError, DvcException)
        cause = error.__cause__ if isinstance(error, DvcException) and error.__cause__ else error
        return False, f"push to {url} failed: {cause}".splitlines()[0]
    return True, f"pushed {count} files to {url}"
