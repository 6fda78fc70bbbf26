"""The promotion gate: a candidate replaces the champion only when it is better by a margin and breaks nothing.

Both models are scored by the same function (``tasks.stages.eval.evaluate_model``) on the same held-out split,
seeded the same way, so the comparison is the model's and nothing else's: the candidate by the pipeline's own
evaluation stage, which has just run, the champion afresh here.
"""

import json
import tempfile
from pathlib import Path

import dvc.api

from tasks.common.artifacts import metrics_dir, stage_dir
from tasks.common.config import Params, RetrainConfig
from tasks.common.config.operations import guard_direction
from tasks.kinds import stage_kinds
from tasks.pipelines import evaluation_of
from tasks.stages.eval import evaluate_model, logged_metrics


def decide(candidate: dict[str, float], champion: dict[str, float] | None, cfg: RetrainConfig) -> tuple[bool, str]:
    """(promote?, why) for ``candidate``'s metrics against ``champion``'s (None: there is no champion yet)."""
    if champion is None:
        return True, "no champion yet: the first candidate is promoted"
    gain = candidate[cfg.metric] - champion[cfg.metric]
    regressed = []
    for metric, tolerance in cfg.guards.items():
        if metric not in candidate or metric not in champion:
            raise ValueError(f"retrain.guards.{metric}: the evaluation reports no {metric} for this pipeline's model")
        direction = guard_direction(cfg, metric)
        worse = champion[metric] - candidate[metric]
        if direction == "lower":
            worse = -worse
        if worse > tolerance:
            moved = "fell" if direction == "higher" else "rose"
            regressed.append(f"{metric} {moved} {worse:.4f} (tolerance {tolerance})")
    if regressed:
        return False, "guard regressed: " + "; ".join(regressed)
    versus = f"{cfg.metric} {candidate[cfg.metric]:.4f} vs champion {champion[cfg.metric]:.4f}: gain {gain:+.4f}"
    if gain < cfg.margin:
        return False, f"{versus} < margin {cfg.margin}"
    return True, f"{versus} >= margin {cfg.margin}"


def score(model: Path, params: Params, kind: str, project: Path) -> dict[str, float]:
    """The held-out metrics of ``model``, trained by a stage of ``kind``, as its evaluation stage measures them: on
    that stage's held-out split in ``project``, with its params section (eval, agent_eval)."""
    evaluation = stage_kinds()[stage_kinds()[kind].evaluation]
    metrics, _ = evaluate_model(model, params, project / stage_dir(evaluation.reads["data"]), evaluation.section)
    return logged_metrics(model, metrics)


def evaluated(project: Path, model: str) -> dict[str, float]:
    """The held-out metrics the evaluation stage of ``model`` (``sft``, ``grpo_final/1``) logged in ``project``."""
    return json.loads((project / metrics_dir(evaluation_of(model)) / "metrics.json").read_text())


def score_at(project: Path, commit: str, path: Path, params: Params, kind: str) -> dict[str, float]:
    """The gate's metrics of the model ``path`` as of ``commit``: its files from the local cache, or the remote."""
    with tempfile.TemporaryDirectory(prefix="champion-") as where:
        copy = Path(where) / path.name  # fsspec copies a directory's contents into a destination not yet there
        dvc.api.DVCFileSystem(str(project), rev=commit).get(str(path), str(copy), recursive=True)
        return score(copy, params, kind, project)
