"""The params sections of how pipelines run: Prefect and Ray, scheduled retraining and its gate, the DVC remote."""

from __future__ import annotations

from typing import Annotated

from tasks.common.config.fields import OneOf, Weight, mapping, param, schema_section, section
from tasks.common.config.sections import StageResources

# What the gate can compare, each higher-is-better: eval@<model>'s metrics.
GATE_METRICS = ("pass@1", "pass@k", "sample_accuracy", "gold_reward", "format_rate")
# Every metric eval@<model> (or agent_eval) reports that has a better direction: what retrain.guards may name.
GUARD_DIRECTIONS = {
    **dict.fromkeys((*GATE_METRICS, "env_reward"), "higher"),
    **dict.fromkeys(("response_length", "truncated_rate", "tool_errors", "max_turns_rate"), "lower"),
}


def _default_resources() -> dict[str, StageResources]:
    # A stage computes with torch's default thread count (the machine's cores): reserving fewer CPUs
    # would let Ray run stages side by side on the same cores, and oversubscribed threads run slower
    # than the same stages one after the other. On more cores, lower these to run stages in parallel.
    return {"default": StageResources(num_cpus=2.0)}


@schema_section
class RunnerConfig:
    """How the Prefect flows run the DAG; none of it changes what a stage produces."""

    ray_address: str | None = param(
        None, "Address of a running Ray cluster; null uses RAY_ADDRESS when set, else starts a local Ray."
    )
    retries: int = param(0, "Times Prefect retries a failed stage (it resumes from its last checkpoint).", ge=0)
    retry_delay_seconds: float = param(5.0, "Wait before a retry.", ge=0)
    resources: dict[str, StageResources] = mapping(
        _default_resources, "Ray resources by stage kind (data, base, sft, eval); 'default' for the others."
    )
    schedules: dict[str, str] = mapping(
        dict, "Cron schedule of `alignflow retrain` by pipeline name for `alignflow serve`, e.g. {sft: '0 3 * * 1'}."
    )


@schema_section
class RetrainConfig:
    """`alignflow retrain PIPELINE`: a candidate trained on the current data, gated against the `prod` champion."""

    metric: Annotated[str, OneOf(GATE_METRICS)] = param(
        "pass@1", "The gate's primary metric, of eval@<model> on the held-out split."
    )
    margin: float = param(
        0.02,
        "Promote only when the candidate's metric beats the champion's by at least this: a tie or a gain within "
        "the held-out set's noise keeps the model in production.",
        ge=0,
        le=1,
        why="every gate metric lies in [0, 1], so a larger margin could never promote a candidate",
    )
    guards: dict[str, Weight] = mapping(
        lambda: {"format_rate": 0.05, "response_length": 16.0},
        "Metrics that must not regress: metric -> the most the candidate may be worse than the champion, in the "
        "metric's units (a rate's fraction, response_length's tokens); worse is lower for "
        f"{', '.join(m for m, d in GUARD_DIRECTIONS.items() if d == 'higher')} and higher for "
        f"{', '.join(m for m, d in GUARD_DIRECTIONS.items() if d == 'lower')}; any other metric the eval reports "
        "(turns, a task's own) with its direction in retrain.directions.",
    )
    directions: dict[str, str] = mapping(
        dict,
        "The better direction, higher or lower, of each guarded metric the gate does not know: {turns: lower}.",
    )
    quarantine: str | None = param(
        "data/quarantine",
        "Where a rejected candidate's new shards move, out of data.train_file's reach, so the next candidate "
        "trains without them (move one back to retry it); null leaves them in place.",
    )


@schema_section
class RemoteConfig:
    """The DVC remote every finished run pushes its artifacts to (written into .dvc/config as `alignflow`)."""

    url: str = param(
        "~/.alignflow/remote",
        "A DVC remote URL: a directory (the default, one machine), s3://bucket/path, gs://, azure://, ssh://... "
        "(install the matching dvc extra, e.g. dvc-s3). Credentials come from the environment, never params.",
    )
    endpoint_url: str | None = param(
        None, "The endpoint of an S3-compatible server (MinIO, Ceph, moto): e.g. http://127.0.0.1:9000."
    )
    push: bool = param(True, "Push after every finished run; false keeps everything in the local cache.")


TRACKERS = ("mlflow", "tensorboard")


@schema_section
class TrackingConfig:
    """Where every stage's params, per-step and final metrics and lineage go besides DVCLive (always on)."""

    to: list[Annotated[str, OneOf(TRACKERS)]] = mapping(
        list, f"Trackers beside DVCLive, any of {', '.join(TRACKERS)}; none by default. Local stores, no network."
    )
    mlflow_uri: str = param(
        "sqlite:///mlflow.db",
        "MLflow's tracking store: a database in the project by default (`mlflow ui --backend-store-uri "
        "sqlite:///mlflow.db`), or a tracking server's URL.",
    )
    experiment: str = param("alignflow", "The MLflow experiment the runs go under.", min_length=1)
    tensorboard_dir: str = param(
        "tensorboard",
        "TensorBoard's event files: a folder per pipeline run, a subfolder per stage (`tensorboard --logdir DIR`).",
    )


@schema_section
class OperationsSections:
    """The sections of params.yaml for how pipelines run, retrain and store: ``Params`` holds them."""

    runner: RunnerConfig = section(RunnerConfig, "Prefect and Ray: retries, resources, schedules.")
    retrain: RetrainConfig = section(RetrainConfig, "Scheduled retraining: the gate between candidate and champion.")
    remote: RemoteConfig = section(RemoteConfig, "Where artifacts live beyond this disk: a DVC remote.")
    tracking: TrackingConfig = section(TrackingConfig, "Trackers beside DVCLive: MLflow, TensorBoard.")


def guard_direction(cfg: RetrainConfig, metric: str) -> str | None:
    """Which way ``metric`` is better for the gate's guards (``retrain.directions``, else the known metrics'); None
    for a metric of unknown direction."""
    return cfg.directions.get(metric, GUARD_DIRECTIONS.get(metric))
