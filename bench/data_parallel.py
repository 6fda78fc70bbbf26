"""SFT steps per second with 1 and 2 data-parallel workers (1 thread each), side by side, and the scaling efficiency.

Each configuration runs the sft stage twice, for ``--short`` and ``--long`` steps, and the rate is the difference:
steps / (time(long) - time(short)), so Ray's start-up, placement and model loading (paid once per stage) drop out.
The rounds alternate the configurations, so drift on a shared machine hits both alike.

    .venv/bin/python bench/data_parallel.py --rounds 2
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import ENV, make_project  # noqa: E402

# The default model and batch (what the stage trains at the defaults; the project's TINY model is undone), on a small
# generated split.
SETTINGS = (
    "base.hidden_size=96",
    "base.num_layers=3",
    "base.num_heads=4",
    "base.intermediate_size=384",
    "data.num_train=4096",
    "sft.batch_size=64",
    "sft.log_every=10",
    "sft.save_every=100000",
    "sft.warmup_steps=5",
)


def _stage_seconds(project: Path, workers: int, steps: int) -> float:
    overrides = [f"sft.max_steps={steps}", f"sft.parallel.num_workers={workers}", "sft.parallel.threads_per_worker=1"]
    # One worker trains in the stage's own process: one thread there too, as each of two workers has.
    env = {**ENV, "OMP_NUM_THREADS": "1"} if workers == 1 else ENV
    started = time.perf_counter()
    subprocess.run(["alignflow", "stage", "sft", *overrides], cwd=project, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--long", type=int, default=110)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        project = make_project(Path(where), SETTINGS)
        for stage in ("data", "base"):
            subprocess.run(["alignflow", "stage", stage], cwd=project, env=ENV, check=True, capture_output=True)
        rates: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.rounds):
            for workers in rates:
                extra = _stage_seconds(project, workers, args.long) - _stage_seconds(project, workers, args.short)
                rates[workers].append((args.long - args.short) / extra)
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print(f"sft steps/s (median of {args.rounds}): 1 worker {one:.2f}, 2 workers {two:.2f}")
    print(f"speed-up {two / one:.2f}x; scaling efficiency {two / one / 2:.0%} (1 thread per worker)")


if __name__ == "__main__":
    main()
