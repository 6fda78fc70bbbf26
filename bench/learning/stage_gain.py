"""A model's held-out gain over its start, in a project where both were evaluated (``alignflow stage
eval@MODEL``): greedy pass@1 of each with its standard error, and the paired gain with the standard error of the
difference on the same problems.

    .venv/bin/python -m bench.learning.stage_gain --project DIR MODEL START [--evaluation eval]
"""

import argparse
import math
from pathlib import Path

from bench.harness import paired_gap
from bench.learning.real_model_pipelines import greedy_rows


def verdicts(project: Path, evaluation: str, model: str) -> dict[str, bool]:
    """Each held-out prompt's greedy verdict."""
    return {row["prompt"]: bool(row["correct"]) for row in greedy_rows(project, evaluation, model)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("start")
    parser.add_argument("--project", type=Path, default=Path("."))
    parser.add_argument("--evaluation", default="eval")
    args = parser.parse_args()
    model, start = (verdicts(args.project, args.evaluation, name) for name in (args.model, args.start))
    prompts = sorted(model)
    if sorted(start) != prompts:
        raise SystemExit(f"{args.model} and {args.start} were evaluated on different problems")
    for name, found in ((args.start, start), (args.model, model)):
        p = sum(found.values()) / len(found)
        print(f"{name:<14} pass@1 {p:.3f} ± {math.sqrt(p * (1 - p) / len(found)):.3f}  ({len(found)} problems)")
    gain, error = paired_gap([model[p] for p in prompts], [start[p] for p in prompts])
    print(f"gain of {args.model} over {args.start}: {gain:+.3f} ± {error:.3f} (paired standard error)")


if __name__ == "__main__":
    main()
