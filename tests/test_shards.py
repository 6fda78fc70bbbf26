"""New shards of your own before a retrain: versioned when the data stage would take them, set aside when it would
not, so one bad shard never blocks the retrains after it."""

import pytest

from flows.retrain import track_shards
from tasks.data.datasets import generate_splits, write_jsonl
from tasks.params.load import load_params
from tests.conftest import make_project


def test_a_shard_holding_a_held_out_problem_is_quarantined_unversioned_and_the_next_retrain_runs(tmp_path, monkeypatch):
    project = make_project(tmp_path)
    params = load_params(project / "params.yaml", ["data.train_file=null"])
    train, test = generate_splits(params.task, params.data.num_train, params.data.num_test, params.seed)
    (project / "data/shards").mkdir(parents=True)
    write_jsonl(project / "data/shards/1.jsonl", train[:100])
    monkeypatch.chdir(project)
    params = load_params(project / "params.yaml", ["data.train_file=data/shards"])
    assert track_shards(project, params) == ["data/shards/1.jsonl"]
    assert (project / "data/shards/1.jsonl.dvc").is_file()

    write_jsonl(project / "data/shards/2.jsonl", [*train[100:110], test[0]])  # a held-out problem in training
    with pytest.raises(ValueError, match=r"1 prompt\(s\) are in both splits.*moved to data/quarantine/2.jsonl"):
        track_shards(project, params)
    assert sorted(p.name for p in (project / "data/shards").iterdir()) == [".gitignore", "1.jsonl", "1.jsonl.dvc"]
    assert sorted(p.name for p in (project / "data/quarantine").iterdir()) == ["2.jsonl"]

    write_jsonl(project / "data/shards/3.jsonl", train[110:120])
    assert track_shards(project, params) == ["data/shards/1.jsonl", "data/shards/3.jsonl"]
    assert (project / "data/shards/3.jsonl.dvc").is_file()
