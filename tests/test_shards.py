"""New shards of your own before a retrain: versioned when the data stage would take them, set aside when it would
not, so one bad shard never blocks the retrains after it; the agent pipeline's shards as well."""

import json
import subprocess

import pytest

from flows.retrain import data_sections, track_shards
from tasks.data.datasets import generate_splits, write_jsonl
from tasks.params.load import load_params
from tests.conftest import ENV, make_project


def _project_with_a_versioned_shard(tmp_path, monkeypatch):
    """A project whose data/shards/1.jsonl (100 generated training problems) an earlier retrain versioned: the
    project, its params reading data/shards, and the generated splits."""
    project = make_project(tmp_path)
    params = load_params(project / "params.yaml", ["data.train_file=null"])
    train, test = generate_splits(params.task, params.data.num_train, params.data.num_test, params.seed)
    (project / "data/shards").mkdir(parents=True)
    write_jsonl(project / "data/shards/1.jsonl", train[:100])
    monkeypatch.chdir(project)
    params = load_params(project / "params.yaml", ["data.train_file=data/shards"])
    assert track_shards(project, params, data_sections("sft", params)) == ["data/shards/1.jsonl"]
    assert (project / "data/shards/1.jsonl.dvc").is_file()
    return project, params, train, test


def test_a_shard_holding_a_held_out_problem_is_quarantined_unversioned_and_the_next_retrain_runs(tmp_path, monkeypatch):
    project, params, train, test = _project_with_a_versioned_shard(tmp_path, monkeypatch)

    write_jsonl(project / "data/shards/2.jsonl", [*train[100:110], test[0]])  # a held-out problem in training
    with pytest.raises(ValueError, match=r"1 prompt\(s\) are in both splits.*moved to data/quarantine/2.jsonl"):
        track_shards(project, params, data_sections("sft", params))
    assert sorted(p.name for p in (project / "data/shards").iterdir()) == [".gitignore", "1.jsonl", "1.jsonl.dvc"]
    assert sorted(p.name for p in (project / "data/quarantine").iterdir()) == ["2.jsonl"]

    write_jsonl(project / "data/shards/3.jsonl", train[110:120])
    assert track_shards(project, params, data_sections("sft", params)) == ["data/shards/1.jsonl", "data/shards/3.jsonl"]
    assert (project / "data/shards/3.jsonl.dvc").is_file()


def test_an_agent_shard_whose_trace_does_not_replay_is_quarantined_before_the_agent_retrain(tmp_path, monkeypatch):
    from test_trace_replay import GOOD_CALL, calculator_row

    project = make_project(tmp_path)
    monkeypatch.chdir(project)
    (project / "data/agent").mkdir(parents=True)
    (project / "data/agent/1.jsonl").write_text(json.dumps(calculator_row(GOOD_CALL, "1000")) + "\n")
    params = load_params(project / "params.yaml", ["agent_data.train_file=data/agent", "agent_data.num_test=4"])
    assert data_sections("agent", params) == ["agent_data"]
    assert track_shards(project, params, ["agent_data"]) == ["data/agent/1.jsonl"]

    (project / "data/agent/2.jsonl").write_text(json.dumps(calculator_row(GOOD_CALL, "1001")) + "\n")  # off by one
    with pytest.raises(ValueError, match=r"data/agent/2.jsonl:1: .*'1000' where the trace says '1001'.*moved to"):
        track_shards(project, params, ["agent_data"])
    assert not (project / "data/agent/2.jsonl").exists() and (project / "data/quarantine/2.jsonl").is_file()


@pytest.mark.slow
def test_alignflow_retrain_quarantines_a_corrupt_new_shard_before_any_work(tmp_path, monkeypatch):
    """The command refuses it in one line naming its row, and moves it out of the training split's reach, so the
    retrain after it runs on the shards that remain (no Prefect or Ray started for a refusal)."""
    project, _, _, _ = _project_with_a_versioned_shard(tmp_path, monkeypatch)
    (project / "data/shards/2.jsonl").write_text(json.dumps({"task": "countdown"}) + "\n")
    command = ["alignflow", "retrain", "sft", "data.train_file=data/shards"]
    refused = subprocess.run(command, cwd=project, env=ENV, capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "data/shards/2.jsonl:1:" in refused.stderr and "moved to data/quarantine/2.jsonl:" in refused.stderr
    assert sorted(p.name for p in (project / "data/shards").iterdir()) == [".gitignore", "1.jsonl", "1.jsonl.dvc"]
    assert not (project / "artifacts").exists()
