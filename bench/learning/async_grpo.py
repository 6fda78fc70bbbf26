"""Asynchronous rollouts against the synchronous loop: the R1 ``grpo`` stage's held-out greedy pass@1 with
``max_staleness`` N against 0, seed by seed.

From one cold start (data, base and sft_cold built once with the default seed), each seed runs the ``grpo`` stage
with ``seed=S`` once per leg (``--legs``):

  sync     the default stage: its engine in the actor's process, sampling then training (max_staleness 0);
  engines  two rollout engine actors (``grpo.rollout_engines=2``), sampling then training: the same engines as async,
           so async against it is staleness alone, and against sync it is what another sampling stream alone moves;
  async    the two engine actors sampling the next iteration's prompts while the actor trains
           (``grpo.max_staleness=N``), corrected by the default ``rollout_correction`` (auto: token weights).

Each final model is evaluated by alignflow's evaluator on the held-out split (``--problems N``: its first N; greedy
pass@1, the same problems for every leg, so a gap comes with its paired standard error). The bar: async within 0.03
of sync for every seed. The default split's 200 problems give paired standard errors of about 0.03, as large as
the bar: ``data.num_test=1000`` (an override of every stage, so the cold start is built with it) about 0.012.
Prints each leg's pass@1 and wall-clock seconds (2 engine processes beside the trainer on this machine's cores: the
seconds say what async costs or saves here, not on a GPU).

    .venv/bin/python -m bench.learning.async_grpo [--seeds 0 1 2] [--legs sync engines async] [--staleness 1]
        [--project DIR] [KEY=VALUE ...]      # KEY=VALUE: data.num_test=1000 as measured in docs/r1.md
"""

import argparse
import tempfile
import time
from pathlib import Path

from bench.harness import COLD_START, built_project, paired_gap, stage
from bench.trl.grpo import greedy_verdicts
from tasks.params.load import load_params

BAR = 0.03


def main(
    seeds: list[int], legs: list[str], staleness: int, project: Path, problems: int | None, overrides: list[str]
) -> None:
    built_project(project, COLD_START, overrides)
    params = load_params(str(project / "params.yaml"), overrides)
    # every leg names its settings: `alignflow stage` writes its overrides into params.yaml, where the next leg reads
    settings_of = {
        "sync": ["grpo.rollout_engines=1", "grpo.max_staleness=0"],
        "engines": ["grpo.rollout_engines=2", "grpo.max_staleness=0"],
        "async": ["grpo.rollout_engines=2", f"grpo.max_staleness={staleness}"],
    }
    rows = []
    for seed in seeds:
        verdicts = {}
        for leg in legs:
            started = time.perf_counter()
            stage(project, "grpo", f"seed={seed}", *overrides, *settings_of[leg])
            seconds = time.perf_counter() - started
            verdicts[leg] = greedy_verdicts(project, project / "artifacts/grpo", params, problems)
            rate = sum(verdicts[leg]) / len(verdicts[leg])
            print(f"seed {seed} {leg}: pass@1 {rate:.3f} in {seconds:.0f} s", flush=True)
        if "async" in verdicts:
            for other in ("sync", "engines"):
                if other in verdicts:
                    rows.append((seed, other, *paired_gap(verdicts["async"], verdicts[other])))
    evaluated = len(next(iter(verdicts.values())))
    print(f"\nmax_staleness {staleness}, greedy pass@1 on {evaluated} held-out problems (bar: within {BAR} of sync)")
    for seed, other, gap, error in rows:
        verdict = ("meets" if abs(gap) <= BAR else "misses") if other == "sync" else ""
        print(f"  seed {seed}: async - {other}: {gap:+.3f} +- {error:.3f}  {verdict}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--legs", nargs="+", choices=("sync", "engines", "async"), default=["sync", "engines", "async"])
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--problems", type=int, help="the first N held-out problems evaluated (default: all)")
    parser.add_argument("--project", type=Path, help="the project to build once and reuse (default: a scratch one)")
    parser.add_argument("overrides", nargs="*", help="params overrides of every stage, KEY=VALUE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        project = args.project or Path(scratch) / "project"
        main(args.seeds, args.legs, args.staleness, project, args.problems, args.overrides)
