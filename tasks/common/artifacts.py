"""Where stages put what they produce, and how they put it there without half-writes.

A stage writes into a temporary sibling of its output and renames it into place
only when it finishes, so a failed or killed stage never leaves a partial output
(a leftover ``.tmp-*`` directory from a killed run is cleared on the next start).
The paths here are the ones ``dvc.yaml`` declares.
"""

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.common.errors import MissingUpstreamError
from tasks.common.registry import model_kinds

USER_DATA = Path("data")  # your own datasets and incoming shards: the data stage's dvc.yaml dependency
ARTIFACTS = Path("artifacts")
DATA_DIR = ARTIFACTS / "data"
PREFERENCES_DIR = ARTIFACTS / "preferences"
REWARD_MODEL_DIR = ARTIFACTS / "reward_model"
METRICS = Path("metrics")
CHECKPOINTS = Path(".alignflow") / "checkpoints"


def stage_dir(stage: str) -> Path:
    """Where a stage writes what it produces: ``artifacts/sft``, ``artifacts/eval/sft`` for ``eval@sft``,
    ``artifacts/sft_rs/1`` for ``sft_rs@1``."""
    return ARTIFACTS / stage.replace("@", "/")


def model_dir(model: str) -> Path:
    """The HF directory of a model, named by the stage that trains it (``sft_rs@1``) or by its path (``sft_rs/1``)."""
    return stage_dir(model)


def upstream_model(model: str) -> Path:
    """The HF directory of a model an earlier stage trained (``grpo``, ``sft_rs/1``); when it is not there, an error
    naming the stage to run, instead of transformers' attempt to fetch the name from a model hub."""
    kinds, round_kinds = model_kinds()
    kind, _, round_name = model.replace("@", "/").partition("/")
    if kind not in (round_kinds if round_name else kinds):
        raise MissingUpstreamError(
            f"no stage trains a model named {model!r} (models: {', '.join(kinds)}, or {'|'.join(round_kinds)}/ROUND)"
        )
    path = model_dir(model)
    if not (path / "config.json").is_file():
        stage = f"{kind}@{round_name}" if round_name else kind
        raise MissingUpstreamError(
            f"{path}: no model there yet; run `alignflow stage {stage}` first (or `alignflow repro` a pipeline "
            "that contains it)"
        )
    return path


def metrics_dir(stage: str) -> Path:
    """The dvclive directory of a stage (``metrics.json`` plus ``plots/``): ``metrics/sft``, ``metrics/eval/sft``."""
    return METRICS / stage.replace("@", "/")


# Beside a stage's metrics, the wall-clock numbers of a stage that trains (throughput, MFU, seconds per step) and
# of each of its steps: not outputs, as they differ run to run and dvc.lock hashes a stage's outputs.
PERF_FILE, PERF_STEPS_FILE = "perf.json", "perf_steps.tsv"


def member_dirs(root: Path = REWARD_MODEL_DIR) -> list[Path]:
    """The reward-model ensemble's model directories, in member order."""
    return sorted(root.glob("member-*"), key=lambda path: int(path.name.split("-")[1]))


@contextmanager
def atomic_output(final: Path) -> Iterator[Path]:
    """Yield a temporary path to fill; on success it replaces ``final``, on failure it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".tmp-{final.name}-*"):
        _remove(stale)
    temporary = final.parent / f".tmp-{final.name}-{os.getpid()}"
    try:
        yield temporary
        if final.is_dir():
            # A directory cannot be replaced in one rename: move the old one aside first.
            previous = final.parent / f".tmp-{final.name}-{os.getpid()}-previous"
            os.replace(final, previous)
            os.replace(temporary, final)
            _remove(previous)
        else:
            os.replace(temporary, final)
    finally:
        _remove(temporary)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
