"""A finished stage's record sent to the trackers ``tracking.to`` names, beside DVCLive (always on).

DVCLive stays the one logging call inside a stage; what it wrote (``metrics/<stage>``: the final metrics, each
per-step series) is read back when the stage ends and sent on, with the stage's params (the keys its kind
declares) and its lineage (the DVC hash of every artifact it read, from dvc.lock: the dataset, the models, the
reward models), which only alignflow knows:

- MLflow: a run per stage, the child of its pipeline run (``alignflow repro``/``run`` open one per pipeline), in a
  local store by default (``mlflow ui --backend-store-uri sqlite:///mlflow.db``);
- TensorBoard: event files under ``tracking.tensorboard_dir/<pipeline run>/<stage>`` (``tensorboard --logdir``).

No network is needed for either. A tracker that fails says so as a warning; the stage's own outputs are already in
place and stay valid.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tasks.common.artifacts import metrics_dir, stage_dir
from tasks.common.config import to_dict
from tasks.common.errors import warn

# What `alignflow repro`/`run` hands its stages' processes: the pipeline run they belong to.
RUN_NAME_VAR = "ALIGNFLOW_TRACKING_RUN"
MLFLOW_PARENT_VAR = "ALIGNFLOW_MLFLOW_PARENT_RUN"
MLFLOW_PARENT_TAG = "mlflow.parentRunId"  # MLflow's system tag: the UI nests a run under that parent
STANDALONE = "stages"  # the TensorBoard folder of stages run outside a pipeline run


@dataclass(frozen=True)
class StageRecord:
    stage: str
    params: dict[str, Any]  # dotted key -> value
    steps: dict[str, list[tuple[int, float]]]  # metric -> (step, value) points
    metrics: dict[str, float]  # dotted name -> final value
    lineage: dict[str, str]  # input name -> "artifact@hash"


def stage_record(stage: str, param_values: dict[str, Any], inputs: dict[str, str], project: Path) -> StageRecord:
    """What DVCLive wrote for ``stage`` (its directory landed), its params and the dvc.lock hash of each of its
    ``inputs`` (input name -> artifact name)."""
    directory = metrics_dir(stage)
    steps = {}
    for series in sorted((directory / "plots" / "metrics").rglob("*.tsv")):
        name = str(series.relative_to(directory / "plots" / "metrics").with_suffix(""))
        with series.open() as rows:
            steps[name] = [(int(row["step"]), float(row[series.stem])) for row in csv.DictReader(rows, delimiter="\t")]
    metrics_file = directory / "metrics.json"
    final = _flat(json.loads(metrics_file.read_text())) if metrics_file.is_file() else {}
    numbers = {name: float(value) for name, value in final.items() if isinstance(value, int | float)}
    return StageRecord(stage, param_values, steps, numbers, lineage(inputs, project))


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def param_values(params: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """Each of ``keys`` (a section, or a key in one) of ``params`` as dotted keys and plain values."""
    values: dict[str, Any] = {}
    for key in keys:
        value: Any = params
        for part in key.split("."):
            value = getattr(value, part)
        plain = _plain(value)
        values |= _flat(plain, f"{key}.") if isinstance(plain, dict) else {key: plain}
    return values


def _plain(value: Any) -> Any:
    """A params value as JSON's types: a section or a mapping of sections (``rounds``) as nested dicts."""
    if hasattr(value, "__dataclass_fields__"):
        return to_dict(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return list(value) if isinstance(value, tuple) else value


def lineage(inputs: dict[str, str], project: Path) -> dict[str, str]:
    """Each input's artifact with the hash dvc.lock recorded for it (``?`` when no repro recorded it yet)."""
    lock = project / "dvc.lock"
    outs = {}
    if lock.is_file():
        for entry in (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).values():
            outs |= {out["path"]: out.get("md5", "?") for out in entry.get("outs", [])}
    # an artifact's directory as dvc.lock names it: artifacts/sft, artifacts/rejection/1 (rejection@1)
    return {name: f"{artifact}@{outs.get(stage_dir(artifact).as_posix(), '?')}" for name, artifact in inputs.items()}


def export(record: StageRecord, tracking: Any) -> None:
    """Send ``record`` to each tracker ``tracking.to`` names; a failing one is a warning naming it."""
    for tracker in tracking.to:
        try:
            (_to_mlflow if tracker == "mlflow" else _to_tensorboard)(record, tracking)
        except Exception as error:  # a tracker's store or server, not the stage: its outputs are in place
            warn(f"tracking: {tracker} did not take {record.stage}'s record ({type(error).__name__}: {error})")


def _to_mlflow(record: StageRecord, tracking: Any) -> None:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    client = MlflowClient(tracking.mlflow_uri)
    parent = os.environ.get(MLFLOW_PARENT_VAR)
    experiment = _experiment(client, tracking.experiment)
    tags = {"alignflow.stage": record.stage} | ({MLFLOW_PARENT_TAG: parent} if parent else {})
    run = client.create_run(experiment, run_name=record.stage, tags=tags)
    now = int(time.time() * 1000)
    points = [Metric(_mlflow_name(n), value, now, step) for n, series in record.steps.items() for step, value in series]
    points += [Metric(_mlflow_name(f"final/{name}"), value, now, 0) for name, value in record.metrics.items()]
    params = [Param(_mlflow_name(key), _text(value)) for key, value in record.params.items()]
    lineage = [RunTag(f"lineage.{name}", value) for name, value in record.lineage.items()]
    status = "FAILED"
    try:
        client.log_batch(run.info.run_id, metrics=points, params=params, tags=lineage)  # it splits what is too long
        status = "FINISHED"
    finally:
        client.set_terminated(run.info.run_id, status)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _mlflow_name(name: str) -> str:
    """A metric's name as MLflow takes it (no '@'): pass@1 is pass_at_1."""
    return re.sub(r"[^\w\-. :/]", "_", name.replace("@", "_at_"))


def _experiment(client: Any, name: str) -> str:
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)


def _to_tensorboard(record: StageRecord, tracking: Any) -> None:
    from torch.utils.tensorboard import SummaryWriter

    directory = Path(tracking.tensorboard_dir) / os.environ.get(RUN_NAME_VAR, STANDALONE) / record.stage
    with contextlib.closing(SummaryWriter(str(directory))) as writer:
        for name, series in record.steps.items():
            for step, value in series:
                writer.add_scalar(name, value, step)
        lines = [f"{key} = {value}" for key, value in record.params.items()]
        writer.add_text("params", "\n\n".join(lines) or "(none)")
        writer.add_text("lineage", "\n\n".join(f"{k}: {v}" for k, v in record.lineage.items()) or "(no inputs)")
        writer.add_hparams(
            {k: v if isinstance(v, int | float | str | bool) else _text(v) for k, v in record.params.items()},
            {f"final/{name}": value for name, value in record.metrics.items()},
            run_name=".",
        )


@dataclass
class PipelineRun:
    name: str
    failed: bool = False  # the caller's verdict, for a run that ends without raising (a repro's exit status)


@contextlib.contextmanager
def pipeline_run(name: str, tracking: Any) -> Iterator[PipelineRun]:
    """The pipeline run of ``name`` (``rlhf``) the stages run inside this block belong to: an MLflow parent run, a
    TensorBoard folder; their processes learn it from the environment."""
    run = PipelineRun(f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if not tracking.to or os.environ.get(RUN_NAME_VAR):
        yield run
        return
    os.environ[RUN_NAME_VAR] = run.name
    client, parent = None, None
    if "mlflow" in tracking.to:
        try:
            from mlflow import MlflowClient

            client = MlflowClient(tracking.mlflow_uri)
            parent = client.create_run(_experiment(client, tracking.experiment), run_name=run.name).info.run_id
            os.environ[MLFLOW_PARENT_VAR] = parent
        except Exception as error:
            warn(f"tracking: mlflow did not open the pipeline run {run.name} ({type(error).__name__}: {error})")
    try:
        yield run
    except BaseException:
        run.failed = True
        raise
    finally:
        os.environ.pop(RUN_NAME_VAR, None)
        os.environ.pop(MLFLOW_PARENT_VAR, None)
        if parent is not None:
            with contextlib.suppress(Exception):
                client.set_terminated(parent, "FAILED" if run.failed else "FINISHED")
