"""The artifact remote on a real S3-compatible server (moto's, on 127.0.0.1): a finished run pushes, a fresh
clone pulls the same bytes; a remote that is down loses nothing and is retried by the next run (a minute)."""

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

from flows.local_server import free_port
from tests.conftest import ENV, make_project, md5_tree, stages_run, warm

pytestmark = pytest.mark.slow

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3-compatible server on 127.0.0.1, with a bucket ``alignflow``."""
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(endpoint, timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        boto3.client("s3", endpoint_url=endpoint, **_boto_credentials()).create_bucket(Bucket="alignflow")
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDENTIALS["AWS_DEFAULT_REGION"],
    }


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, cwd=cwd, env=warm({**ENV, **CREDENTIALS}), capture_output=True, text=True, timeout=900
    )


def test_push_to_s3_and_pull_into_a_fresh_clone(s3_endpoint, tmp_path):
    remote = ("remote.url=s3://alignflow/runs", f"remote.endpoint_url={s3_endpoint}")
    project = make_project(tmp_path / "project", ("sft.max_steps=20", *remote))
    ran = _run(["alignflow", "repro", "sft"], project)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "pushed" in ran.stdout and "s3://alignflow/runs" in ran.stdout
    objects = boto3.client("s3", endpoint_url=s3_endpoint, **_boto_credentials()).list_objects_v2(Bucket="alignflow")
    assert objects["KeyCount"] > 0

    subprocess.run(["git", "add", "-A"], cwd=project, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "run"], cwd=project, check=True
    )
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(project), str(clone)], check=True)
    pulled = _run([sys.executable, "-m", "dvc", "pull", "--with-deps", "eval@base", "eval@sft"], clone)
    assert pulled.returncode == 0, pulled.stderr
    for output in ("artifacts/data", "artifacts/base", "artifacts/sft"):
        assert md5_tree(clone / output) == md5_tree(project / output), output


def test_a_remote_that_is_down_keeps_the_results_and_the_next_run_pushes_them(s3_endpoint, tmp_path):
    down = ("remote.url=s3://alignflow/later", f"remote.endpoint_url=http://127.0.0.1:{free_port()}")
    project = make_project(tmp_path / "project", ("sft.max_steps=20", *down))
    ran = _run(["alignflow", "repro", "sft"], project)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "warning: push to s3://alignflow/later failed" in ran.stderr
    assert (project / "artifacts/sft/model.safetensors").is_file()

    # The remote is back: the next run has nothing to train and pushes everything the first one produced.
    (project / "params.yaml").write_text(
        (project / "params.yaml").read_text().replace(down[1].split("=", 1)[1], s3_endpoint)
    )
    again = _run(["alignflow", "repro", "sft"], project)
    assert again.returncode == 0 and "pushed" in again.stdout, again.stderr[-3000:]
    assert stages_run(again.stdout) == set()
    status = _run([sys.executable, "-m", "dvc", "status", "--cloud"], project)
    assert "Cache and remote 'alignflow' are in sync" in status.stdout, status.stdout
