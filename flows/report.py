"""The pipeline report: every stage's latest metrics, in pipeline order, read through DVC's own index.

An evaluation stage (its command ``alignflow stage eval@<model>``, or ``agent_eval@<model>``) reports under the
stage that produced the model, so ``sft`` shows both its training metrics and its held-out ``pass@1``, and
``grpo_final@1`` those of ``eval@grpo_final/1``.
"""

import json
import re
from pathlib import Path
from typing import Any

from flows.dag import dependencies_first, open_repo
from tasks.common.artifacts import PERF_FILE
from tasks.kinds import stage_kinds

_EVALUATIONS = "|".join(kind.name for kind in stage_kinds().values() if kind.target == "model")
_EVALUATION = re.compile(rf"alignflow stage (?:{_EVALUATIONS})@(\S+)")


def _flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        elif prefix or key != "step":  # dvclive's step counter, not a nested metric named step
            flat[f"{prefix}{key}"] = value
    return flat


def _metrics_of(stage: Any) -> dict[str, Any]:
    """A stage's metrics, and its wall-clock numbers (perf.json beside them, not an output) under ``perf/``."""
    metrics: dict[str, Any] = {}
    for out in stage.outs:
        path = Path(out.fs_path)
        if out.metric and path.is_file():
            metrics.update(_flatten(json.loads(path.read_text())))
            if (perf := path.with_name(PERF_FILE)).is_file():
                metrics.update(_flatten(json.loads(perf.read_text()), "perf/"))
    return metrics


def stage_metrics(root: str | Path, name: str) -> dict[str, Any]:
    """The flat metrics one stage wrote ({} if none yet)."""
    with open_repo(root) as repo:
        (stage,) = repo.stage.collect(f"{Path(root) / 'dvc.yaml'}:{name}")
        return _metrics_of(stage)


def _owner(stage: Any) -> str:
    """The stage a stage's metrics belong to: itself, or for an evaluation, the stage that trained the model."""
    evaluated = _EVALUATION.fullmatch(stage.cmd if isinstance(stage.cmd, str) else "")
    return evaluated.group(1).replace("/", "@") if evaluated else stage.name


def collect(root: str | Path = ".") -> dict[str, dict[str, Any]]:
    """{stage: {metric: value}} for every stage whose metrics exist, in pipeline order."""
    report: dict[str, dict[str, Any]] = {}
    with open_repo(root) as repo:
        for stage in dependencies_first(repo):
            metrics = _metrics_of(stage)
            if metrics:
                report.setdefault(_owner(stage), {}).update(metrics)
    return report


def markdown_table(report: dict[str, dict[str, Any]]) -> str:
    """The report as one markdown table: a row per stage, a column per metric."""
    columns = list(dict.fromkeys(name for metrics in report.values() for name in metrics))
    rows = ["| stage | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for stage, metrics in report.items():
        rows.append(f"| {stage} | " + " | ".join(_format(metrics.get(c, "")) for c in columns) + " |")
    return "\n".join(rows)


def _format(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def render(report: dict[str, dict[str, Any]]) -> str:
    lines = []
    for stage, metrics in report.items():
        cells = [
            f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}" for name, value in metrics.items()
        ]
        lines.append(f"{stage:<12} " + "  ".join(cells))
    return "\n".join(lines) if lines else "no metrics yet: run the pipeline first (dvc repro)"
