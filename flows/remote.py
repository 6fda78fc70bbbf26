"""The DVC remote where artifacts live beyond this disk, configured from params' ``remote`` section.

The section is written into ``.dvc/config`` as the default remote ``alignflow`` before every push, so a clone
checked out at any registered version names the remote it was pushed to, and ``dvc pull`` restores its bytes.
A push whose every input is as it was at the last successful one (the remote, DVC's files and config, the tags) is
skipped: asking the remote what it lacks is most of a run that trained nothing.
"""

import hashlib
import os
import subprocess
from pathlib import Path

from dvc.exceptions import DvcException

from flows.dag import open_repo
from tasks.common.config import RemoteConfig

REMOTE = "alignflow"
# The fingerprint of what the last successful push sent, and where: in DVC's own untracked tmp/, per workspace.
PUSHED = Path(".dvc", "tmp", "alignflow-pushed")
_DVC_FILES = ("*.dvc", ":(glob)**/dvc.yaml", ":(glob)**/dvc.lock")  # git pathspecs, at any depth
_DVC_CONFIG = (".dvc/config", ".dvc/config.local")


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

    Returns (pushed?, "pushed N files to URL", "nothing new to push to URL" or "push to URL failed: why"). A failed
    push loses nothing and records nothing: every object stays in the local cache, and the next push (every tag's,
    not only the newest) sends what is missing.
    """
    url = remote_url(cfg)
    record = project / PUSHED
    if record.is_file() and record.read_text() == _fingerprint(project, cfg):
        return True, f"nothing new to push to {url}"
    configure(project, cfg)
    sent = _fingerprint(project, cfg)  # before pushing: whatever changes meanwhile is pushed by the next run
    try:
        with open_repo(project) as repo:
            count = repo.push(remote=REMOTE, all_tags=True)
    except Exception as error:  # noqa: BLE001 - each filesystem raises its own kind (botocore, OSError, DvcException)
        cause = error.__cause__ if isinstance(error, DvcException) and error.__cause__ else error
        return False, f"push to {url} failed: {cause}".splitlines()[0]
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(sent)
    return True, f"pushed {count} files to {url}"


def _fingerprint(project: Path, cfg: RemoteConfig) -> str:
    """A hash of what decides what a push of every version sends, and where: the remote, the workspace's DVC files
    (dvc.yaml, dvc.lock, ``*.dvc``: the objects they name), DVC's config, and every tag with the commit it names.
    The remote is trusted to keep what it was sent."""
    git = ("git", "-C", str(project))
    listed = subprocess.run(
        [*git, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *_DVC_FILES],
        capture_output=True,
        check=True,
    ).stdout
    tags = subprocess.run(
        [*git, "for-each-ref", "--format=%(refname) %(objectname)", "refs/tags"], capture_output=True, check=True
    ).stdout
    digest = hashlib.sha256(f"{remote_url(cfg)}\0{cfg.endpoint_url}\0".encode() + tags)
    for name in sorted({*listed.decode().split("\0"), *_DVC_CONFIG} - {""}):
        path = project / name
        digest.update(f"{name}\0".encode() + (path.read_bytes() if path.is_file() else b"(none)") + b"\0")
    return digest.hexdigest()
