"""Stage metrics through dvclive, written atomically so ``dvc metrics/plots/exp show`` read whole runs only."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.common.artifacts import PERF_FILE, PERF_STEPS_FILE, atomic_output, metrics_dir
from tasks.common.dvclive_internals import close_repo

if TYPE_CHECKING:
    from dvclive import Live


@contextmanager
def stage_live(stage: str, into: Path | None = None) -> Iterator[Live]:
    """A dvclive logger for ``stage``; its directory replaces ``metrics/<stage>`` when the block succeeds, or,
    ``into`` given, it writes into that temporary directory, which the stage's own process opened with
    ``atomic_output(metrics_dir(stage))`` (a data-parallel worker's metrics land with the stage's model).

    dvc.yaml declares the metrics and plots, so dvclive must not edit it (dvcyaml=None),
    and no wall-clock values are logged: metrics files are hashed into dvc.lock.
    """
    from dvclive import Live  # here, where tracking starts: the trainer's modules load without DVCLive

    with atomic_output(metrics_dir(stage)) if into is None else contextlib.nullcontext(into) as directory:
        live = Live(str(directory), dvcyaml=None, save_dvc_exp=False, report=None)
        try:
            yield live
            live.end()
        finally:
            # dvclive opens the project's DVC repo (and its git packs) and never closes it: left to the interpreter's
            # shutdown after a failure, dulwich's pack finalisers print a traceback each.
            close_repo(live)


def log_step(live: Live, step: int, metrics: dict[str, float], prefix: str = "train/") -> None:
    """Log one step's metrics as plot points (``prefix`` + name) at ``step``."""
    live.step = step
    for name, value in metrics.items():
        live.log_metric(f"{prefix}{name}", value)


def write_perf(live: Live, numbers: dict[str, float], steps: list[dict[str, float]] | None = None) -> None:
    """A stage's wall-clock numbers as ``metrics/<stage>/perf.json`` (throughput, MFU, seconds per step) and, when
    given, ``perf_steps.tsv`` (a row per step: its phases' seconds). They change run to run and dvc.lock hashes a
    stage's outputs, so neither is one: dvc.yaml lists them as top-level metrics and plots instead."""
    rounded = {name: value if isinstance(value, int) else float(f"{value:.4g}") for name, value in numbers.items()}
    (Path(live.dir) / PERF_FILE).write_text(json.dumps(rounded, indent=2) + "\n")
    if steps:
        columns = list(dict.fromkeys(name for row in steps for name in row))
        rows = ["\t".join(f"{row[name]:.4g}" if name in row else "" for name in columns) for row in steps]
        (Path(live.dir) / PERF_STEPS_FILE).write_text("\n".join(["\t".join(columns), *rows]) + "\n")
