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


def remote_url(cfg: RemoteConfig) -> str:
    """``cfg.url`` with ``~`` expanded: params accept only a URL or an absolute directory (a relative one DVC would
    resolve against .dvc/, inside the project)."""
    return cfg.url if "://" in cfg.url else os.path.expanduser(cfg.url)


def configure(project: Path, cfg: RemoteConfig) -> None:
    """Make the params' remote the project's default DVC remote: in .dvc/config, committed with every version so a
    clone knows where its bytes are, and in .dvc/config.local, which DVC reads whichever commit it is looking at,
    so a push of every version's objects sends them all to today's remote (not to the one a version was made with)."""
    remote = {"url": remote_url(cfg)}
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
    url = remote_url(cfg)
    try:
        with open_repo(project) as repo:
            count = repo.push(remote=REMOTE, all_tags=True)
    except Exception as error:  # noqa: BLE001 - each filesystem raises its own kind (botocore, OSError, DvcException)
        cause = error.__cause__ if isinstance(error, DvcException) and error.__cause__ else error
        return False, f"push to {url} failed: {cause}".splitlines()[0]
    return True, f"pushed {count} files to {url}"
