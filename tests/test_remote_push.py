"""The push after a run (flows/remote.py) on a directory remote: it is skipped when nothing it would send or where
changed since the last successful one, and a failed push is tried again by the next run (seconds; the S3 remote's
own tests are in test_remote.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from flows.remote import PUSHED, push
from tasks.common.config import RemoteConfig
from tests.conftest import ENV

GIT = ("git", "-c", "user.name=t", "-c", "user.email=t@t")


def _dvc_add(project: Path, name: str, text: str) -> None:
    (project / name).write_text(text)
    subprocess.run([sys.executable, "-m", "dvc", "add", "-q", name], cwd=project, env=ENV, check=True)


@pytest.fixture
def project(tmp_path) -> Path:
    """A git repo with DVC, one file of data added to DVC's cache."""
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=project, env=ENV, check=True)
    _dvc_add(project, "shard.jsonl", '{"prompt": "1+1", "answer": "2"}\n')
    return project


def test_a_push_with_nothing_new_is_skipped_and_anything_new_is_pushed(project, tmp_path):
    remote = RemoteConfig(url=str(tmp_path / "remote"))
    assert push(project, remote) == (True, f"pushed 1 files to {remote.url}")
    assert push(project, remote) == (True, f"nothing new to push to {remote.url}")

    _dvc_add(project, "more.jsonl", '{"prompt": "2+2", "answer": "4"}\n')  # a new .dvc file, untracked by git
    assert push(project, remote) == (True, f"pushed 1 files to {remote.url}")
    subprocess.run([*GIT, "add", "-A"], cwd=project, check=True)
    subprocess.run([*GIT, "commit", "-qm", "data"], cwd=project, check=True)
    subprocess.run([*GIT, "tag", "sft@v1"], cwd=project, check=True)  # a registered version: its objects go too
    assert push(project, remote) == (True, f"pushed 0 files to {remote.url}")
    assert push(project, remote) == (True, f"nothing new to push to {remote.url}")

    elsewhere = RemoteConfig(url=str(tmp_path / "elsewhere"))  # another remote has none of it
    assert push(project, elsewhere) == (True, f"pushed 2 files to {elsewhere.url}")


def test_a_failed_push_records_nothing_and_the_next_run_pushes(project, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the remote's parent directory should be")
    remote = RemoteConfig(url=str(blocked / "remote"))
    pushed, outcome = push(project, remote)
    assert not pushed and outcome.startswith(f"push to {remote.url} failed"), outcome
    assert not (project / PUSHED).exists()

    blocked.unlink()  # the remote is back, at the same URL, and nothing else changed
    assert push(project, remote) == (True, f"pushed 1 files to {remote.url}")
    assert push(project, remote) == (True, f"nothing new to push to {remote.url}")
