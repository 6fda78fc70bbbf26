"""The pipeline report: every stage's latest metrics, in pipeline order, read through DVC's own index.

An evaluation stage ``eval@<model>`` reports under the stage that produced the
model, so ``sft`` shows both its training metrics and its held-out ``pass@1``.
"""

import json
from pathlib import Path
from typing import Any

import networkx as nx
from dvc.repo import Repo


def pipeline_stages(root: str | Path = ".") -> list[Any]:
    """The stages of the DVC pipeline at ``root``, dependencies first, ties in declaration order."""
    with Repo(str(root)) as repo:
        stages = list(repo.index.stages)
        position = {stage: i for i, stage in enumerate(stages)}
        # DVC's graph points from a stage to the stages it depends on.
        dependencies_first = repo.index.graph.reverse(copy=True)
        return list(nx.lexicographical_topological_sort(dependencies_first, key=lambda s: position[s]))


def _flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        elif key != "step":
            flat[f"{prefix}{key}"] = value
    return flat


def collect(root: str | Path = ".") -> dict[str, dict[str, Any]]:
    """{stage: {metric: value}} for every stage whose metrics exist, in pipeline order."""
    report: dict[str, dict[str, Any]] = {}
    for stage in pipeline_stages(root):
        for out in stage.outs:
            path = Path(out.fs_path)
            if not out.metric or not path.is_file():
                continue
            kind, _, target = stage.addressing.partition("@")
            owner = target if kind == "eval" and target else stage.addressing
            report.setdefault(owner, {}).update(_flatten(json.loads(path.read_text())))
    return report


def render(report: dict[str, dict[str, Any]]) -> str:
    lines = []
    for stage, metrics in report.items():
        cells = [
            f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}" for name, value in metrics.items()
        ]
        lines.append(f"{stage:<12} " + "  ".join(cells))
    return "\n".join(lines) if lines else "no metrics yet: run the pipeline first (dvc repro)"
