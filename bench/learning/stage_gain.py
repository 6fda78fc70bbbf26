"""A model's held-out gain over its start, in a project where both were evaluated (``alignflow stage
eval@MODEL``): greedy pass@1 of each with its standard error, and the paired gain with the standard error of the
difference on the same problems.

    .venv/bin/python -m bench.learning.stage_gain --project DIR MODEL START [--evaluation eval]
"""

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from bench.harness import paired_gap
from bench.learning.real_model_pipelines import greedy_rows


def verdicts(project: Path, evaluation: str, model: str) -> dict[str, bool]:
    """Each held-out prompt's greedy verdict."""
    return {row["prompt"]: bool(row["correct"]) for row in greedy_rows(project, evaluation, model)}


@dataclass(frozen=True)
class Gain:
    """``model``'s greedy pass@1 over ``start``'s on the same held-out prompts."""

    gain: float
    standard_error: float  # of the paired difference
    fixed: int  # prompts ``model`` gets right and ``start`` wrong
    broken: int  # the other way round
    problems: int
    start_pass: float  # ``start``'s pass@1 on them
    model_pass: float


def gain(project: Path, evaluation: str, model: str, start: str) -> Gain:
    """The paired gain of ``model`` over ``start``, both evaluated by ``evaluation`` in ``project``."""
    after, before = verdicts(project, evaluation, model), verdicts(project, evaluation, start)
    prompts = sorted(after)
    if sorted(before) != prompts:
        raise SystemExit(f"{model} and {start} were evaluated on different problems")
    difference, error = paired_gap([after[p] for p in prompts], [before[p] for p in prompts])
    fixed = sum(after[p] and not before[p] for p in prompts)
    broken = sum(before[p] and not after[p] for p in prompts)
    n = len(prompts)
    return Gain(difference, error, fixed, broken, n, sum(before.values()) / n, sum(after.values()) / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("start")
    parser.add_argument("--project", type=Path, default=Path("."))
    parser.add_argument("--evaluation", default="eval")
    args = parser.parse_args()
    compared = gain(args.project, args.evaluation, args.model, args.start)
    n = compared.problems
    for name, p in ((args.start, compared.start_pass), (args.model, compared.model_pass)):
        print(f"{name:<14} pass@1 {p:.3f} ± {math.sqrt(p * (1 - p) / n):.3f}  ({n} problems)")
    print(
        f"gain of {args.model} over {args.start}: {compared.gain:+.3f} ± {compared.standard_error:.3f} (paired "
        f"standard error; {compared.fixed} fixed, {compared.broken} broken)"
    )


if __name__ == "__main__":
    main()
