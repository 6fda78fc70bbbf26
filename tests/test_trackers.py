"""Trackers beside DVCLive: `alignflow repro sft` with `tracking.to=[mlflow,tensorboard]` sends every stage's params,
per-step and final metrics and lineage to a local MLflow store (one parent run, a child per stage) and to
TensorBoard event files, equal to what DVCLive and dvc.lock hold."""

import csv
import json
import subprocess

import pytest
import yaml

from tasks.common.artifacts import metrics_dir
from tasks.common.trackers import lineage, param_values
from tasks.kinds import stage_kinds
from tasks.params.load import load_params
from tests.conftest import REPO, make_project, md5_tree, warm

STAGES = {"data", "base", "sft", "eval@base", "eval@sft"}


def test_a_stage_of_a_round_sends_its_rounds_as_keys_and_its_round_inputs_hashes(tmp_path):
    params = load_params(REPO / "params.yaml")
    values = param_values(params, stage_kinds()["rejection"].param_keys)
    assert values["rounds.1.policy"] == "grpo" and json.dumps(values)  # plain values, each a key of its own
    lock = {"stages": {"rejection@1": {"outs": [{"path": "artifacts/rejection/1", "md5": "abc.dir"}]}}}
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    inputs = {"data": "rejection@1", "init": "grpo"}
    assert lineage(inputs, tmp_path) == {"data": "rejection@1@abc.dir", "init": "grpo@?"}  # grpo: not run yet


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("tracked"), ("tracking.to=[mlflow,tensorboard]",))
    result = subprocess.run(["alignflow", "repro", "sft"], cwd=project, env=warm(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tracking:" not in result.stderr  # no tracker warned
    return project


def _dvclive_series(project, stage: str, name: str) -> list[tuple[int, float]]:
    with (project / metrics_dir(stage) / f"plots/metrics/{name}.tsv").open() as rows:
        column = name.rpartition("/")[2]
        return [(int(row["step"]), float(row[column])) for row in csv.DictReader(rows, delimiter="\t")]


@pytest.mark.slow
def test_mlflow_holds_one_pipeline_run_with_a_child_per_stage_and_what_dvc_holds(tracked):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tracked / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("alignflow").experiment_id
    runs = client.search_runs([experiment])
    parents = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    assert len(parents) == 1 and parents[0].info.run_name.startswith("sft-")
    assert parents[0].info.status == "FINISHED"
    children = {run.info.run_name: run for run in runs if run.data.tags.get("mlflow.parentRunId")}
    assert set(children) == STAGES
    assert all(run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for run in children.values())

    sft = children["sft"]
    params = yaml.safe_load((tracked / "params.yaml").read_text())
    assert json.loads(sft.data.params["sft.lr"]) == params["sft"]["lr"]
    assert "ppo.actor_lr" not in sft.data.params  # only what the stage declares
    history = client.get_metric_history(sft.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == _dvclive_series(
        tracked, "sft", "train/loss"
    )
    final = json.loads((tracked / metrics_dir("eval@sft") / "metrics.json").read_text())
    assert children["eval@sft"].data.metrics["final/pass_at_1"] == final["pass@1"]  # MLflow's names take no '@'

    lock = yaml.safe_load((tracked / "dvc.lock").read_text())["stages"]
    hashes = {out["path"]: out["md5"] for stage in lock.values() for out in stage.get("outs", [])}
    assert sft.data.tags["lineage.data"] == f"data@{hashes['artifacts/data']}"
    assert children["eval@sft"].data.tags["lineage.model"] == f"sft@{hashes['artifacts/sft']}"


@pytest.mark.slow
def test_tensorboard_holds_each_stage_curve_under_the_pipeline_run(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = [path for path in (tracked / "tensorboard").iterdir()]
    assert run.name.startswith("sft-") and {path.name for path in run.iterdir()} == STAGES
    events = EventAccumulator(str(run / "sft"))
    events.Reload()
    steps, values = zip(*[(event.step, event.value) for event in events.Scalars("train/loss")], strict=True)
    logged_steps, logged = zip(*_dvclive_series(tracked, "sft", "train/loss"), strict=True)
    assert steps == logged_steps and values == pytest.approx(logged, rel=1e-6)  # float32 in the event file


@pytest.mark.slow
def test_a_tracker_that_cannot_write_is_one_warning_each_and_the_stage_lands_as_without_it(tmp_path):
    def data_stage(project, *tracking: str) -> subprocess.CompletedProcess:
        make_project(project, tracking)
        (project / "blocked").write_text("a file where the trackers' stores would be folders")
        return subprocess.run(["alignflow", "stage", "data"], cwd=project, env=warm(), capture_output=True, text=True)

    tracked = data_stage(
        tmp_path / "tracked",
        "tracking.to=[mlflow,tensorboard]",
        "tracking.mlflow_uri=sqlite:///blocked/mlflow.db",
        "tracking.tensorboard_dir=blocked/tensorboard",
    )
    assert tracked.returncode == 0, tracked.stdout + tracked.stderr
    warnings = [line for line in tracked.stderr.splitlines() if "tracking:" in line]
    assert len(warnings) == 2, tracked.stderr
    assert "mlflow did not take data's record" in warnings[0] and "tensorboard did not take" in warnings[1]
    untracked = data_stage(tmp_path / "untracked")
    assert untracked.returncode == 0, untracked.stdout + untracked.stderr
    assert md5_tree(tmp_path / "tracked/artifacts/data") == md5_tree(tmp_path / "untracked/artifacts/data")
    assert (tmp_path / "tracked/metrics/data").is_dir()
