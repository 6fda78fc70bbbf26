"""A task module of your own is code like the stages': editing its generator, verifier or environment re-runs its
data stage and the stages that read that data, while the same code re-runs nothing (``sources/<section>.task.sha256``,
written by dvc.yaml's ``sources`` stage on every repro), under ``alignflow repro`` and plain ``dvc repro`` alike."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, make_project, stages_run, warm

pytestmark = pytest.mark.slow


def _alignflow(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["alignflow", *args], cwd=project, env=warm(), capture_output=True, text=True)


def test_an_edited_task_module_reruns_its_data_and_an_unchanged_one_nothing(tmp_path):
    overrides = ("agent_data.task=mygame", "agent_data.num_train=20", "agent_data.num_test=5")
    project = make_project(tmp_path / "project", overrides)
    shutil.copytree(REPO / "examples/guess_number", project / "mygame")  # a game of the user's own, by import path
    first = _alignflow(project, "repro", "agent_data")
    assert first.returncode == 0 and "Running stage 'agent_data'" in first.stdout, first.stderr[-2000:]
    same = _alignflow(project, "repro", "agent_data")
    assert same.returncode == 0 and stages_run(same.stdout) == set(), same.stdout

    rows = (project / "artifacts/agent_data/train.jsonl").read_text()
    game = project / "mygame/__init__.py"
    game.write_text(game.read_text().replace('"format error"', '"unreadable"'))  # the world's reply, not its data
    edited = subprocess.run(["dvc", "repro", "agent_data"], cwd=project, env=warm(), capture_output=True, text=True)
    assert edited.returncode == 0 and "Running stage 'agent_data'" in edited.stdout, edited.stdout
    assert (project / "artifacts/agent_data/train.jsonl").read_text() == rows  # the same problems: DVC stops here
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    recorded = {dep["path"] for dep in lock["agent_data"]["deps"]}
    assert "sources/agent_data.task.sha256" in recorded

    # every stage that plays or grades the task's problems lists its code: the environment changed, they re-run
    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    for name in ("agent_sft", "agent_grpo", "agent_eval"):
        body = stages[name].get("do", stages[name])
        assert "sources/agent_data.task.sha256" in body["deps"], name
    assert "sources/data.task.sha256" in stages["grpo"]["deps"] and "sources/base.sha256" not in stages["grpo"]["deps"]
