"""SFT and GRPO steps per second with 1 and 2 data-parallel workers (1 thread each), side by side, and the scaling
efficiency.

SFT: one worker against two. GRPO: one actor with its engine in its process against two actor workers and two
rollout engine replicas (each replica samples half the prompts, each worker trains on half of every minibatch, and
the engines take the actor's weights after every update).

Each configuration runs its stage twice, for a short and a long run, and the rate is the difference:
steps / (time(long) - time(short)), so Ray's start-up, placement and model loading (paid once per stage) drop out.
The rounds alternate the configurations, so drift on a shared machine hits both alike.

    .venv/bin/python -m bench.speed.data_parallel --rounds 2
"""

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.harness import built_project, project_env

# The default model and batches (what the stages train at the defaults), on a small generated split. GRPO from the
# base model is grpo_zero; the length reward differs within every group, so
# every iteration trains (the untrained model never answers right, and accuracy would teach nothing).
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
    "grpo.rewards={length: 1.0}",
    "grpo.dynamic_sampling=false",
    "grpo.rollout_batch_size=32",
    "grpo.group_size=8",
    "grpo.minibatch_size=128",
    "grpo.max_new_tokens=64",
    "grpo.ref_reset_every=null",
    "grpo.save_every=100000",
    "grpo.parallel.cpus_per_worker=0.5",
    "grpo.roles.rollout.num_cpus=0.5",
)

# stage -> (its steps param, the overrides of 1 and of 2 workers, short and long runs in steps)
STAGES = {
    "sft": ("sft.max_steps", {1: ["sft.parallel.num_workers=1"], 2: ["sft.parallel.num_workers=2"]}, (10, 110)),
    "grpo": (
        "grpo.steps",
        {
            1: ["grpo.parallel.num_workers=1", "grpo.rollout_engines=1"],
            2: ["grpo.parallel.num_workers=2", "grpo.rollout_engines=2"],
        },
        (2, 8),
    ),
}
RUNS = {"sft": "sft", "grpo": "grpo_zero"}


def _stage_seconds(project: Path, stage: str, workers: int, steps: int) -> float:
    steps_key, configurations, _ = STAGES[stage]
    overrides = [*SETTINGS, f"{steps_key}={steps}", f"{stage}.parallel.threads_per_worker=1", *configurations[workers]]
    # One worker trains in the stage's own process: one thread there too, as each of two workers has.
    env = project_env(project) | ({"OMP_NUM_THREADS": "1"} if workers == 1 else {})
    started = time.perf_counter()
    command = ["alignflow", "stage", RUNS[stage], *overrides]
    subprocess.run(command, cwd=project, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        project = built_project(Path(where) / "project", ("data", "base"), list(SETTINGS))
        for stage in args.stages:
            short, long = STAGES[stage][2]
            rates: dict[int, list[float]] = {1: [], 2: []}
            for _ in range(args.rounds):
                for workers in rates:
                    extra = _stage_seconds(project, stage, workers, long) - _stage_seconds(
                        project, stage, workers, short
                    )
                    rates[workers].append((long - short) / extra)
            one, two = statistics.median(rates[1]), statistics.median(rates[2])
            print(f"{stage} steps/s (median of {args.rounds}): 1 worker {one:.2f}, 2 workers {two:.2f}")
            print(f"{stage} speed-up {two / one:.2f}x; scaling efficiency {two / one / 2:.0%} (1 thread per worker)")


if __name__ == "__main__":
    main()
