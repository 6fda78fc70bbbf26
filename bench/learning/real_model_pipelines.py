"""What each pipeline gives on the real model: `alignflow repro <pipeline> @examples/smollm2.args` run as a user runs
it, in a scratch clone of this repo per seed, timed stage by stage.

For every model the pipeline evaluates: held-out pass@1 (greedy) with its standard error, the gold judge's reward of
its sampled responses (eval's ``gold_reward``) and of its greedy ones with a standard error; for each stage against
its start (``STARTS``): the gain in pass@1 and in the greedy gold reward, each with the paired standard error of the
difference on the same held-out problems. The runs follow each other, never side by side (they would share this
machine's cores).

    .venv/bin/python -m bench.learning.real_model_pipelines PIPELINE [--seeds 0 1 2] [--out DIR] [KEY=VALUE ...]
    .venv/bin/python -m bench.learning.real_model_pipelines PIPELINE --seeds S --in-project DIR --out DIR2
"""

import argparse
import json
import math
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.harness import clone, paired_gap, project_env
from tasks.data.datasets import read_examples
from tasks.data.judge import gold_utility
from tasks.params.load import load_params
from tasks.pipelines import PIPELINES

# Each evaluated model's start: the model its stage trained from (or, for a student, its teacher to compare with).
STARTS = {
    "sft": "base",
    "sft_cold": "base",
    "grpo": "sft_cold",
    "grpo_zero": "base",
    "sft_rs/1": "grpo",
    "grpo_final/1": "grpo",
    "ppo": "sft_cold",
    "ppo_verifier": "sft_cold",
    "dpo": "sft_cold",
    "online_dpo": "dpo",
    "sft_distill": "student_base",
    "distill": "sft_distill",
    "agent_grpo": "agent_sft",
}


def repro(project: Path, pipeline: str, overrides: list[str]) -> tuple[float, dict[str, float]]:
    """Run ``alignflow repro pipeline`` in ``project`` (a clone of this repo made there first unless it is one
    already): its seconds, and each stage's (the stages DVC runs: an earlier pipeline's are skipped)."""
    if not project.exists():
        clone(project)
    command = ["alignflow", "repro", pipeline, "@examples/smollm2.args", *overrides, "remote.push=false"]
    started = time.perf_counter()
    stages, current, since = {}, None, started
    log_file = project / f"repro-{pipeline}.log"
    with open(log_file, "w") as log:
        process = subprocess.Popen(
            command, cwd=project, env=project_env(project), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for raw in process.stdout:
            line = raw.decode(errors="replace")
            log.write(line)
            if line.startswith(("Running stage '", "Updating lock file")):
                now = time.perf_counter()
                if current is not None:
                    stages[current] = round(now - since, 1)
                current = line.split("'")[1] if line.startswith("Running") else None
                since = now
        if process.wait() != 0:
            raise SystemExit(f"{pipeline} failed in {project}: see {log_file}")
    return time.perf_counter() - started, stages


def greedy_rows(project: Path, evaluation: str, model: str) -> list[dict]:
    """An evaluation's greedy rows: ``episodes.jsonl`` where the task plays episodes, else ``greedy.jsonl``."""
    written = project / f"artifacts/{evaluation}/{model}"
    episodes = written / "episodes.jsonl"
    return [json.loads(line) for line in (episodes if episodes.is_file() else written / "greedy.jsonl").open()]


def evaluations(project: Path, pipeline: str) -> dict[str, dict]:
    """Every model the pipeline evaluates: its metrics, its greedy verdicts and the gold reward of each greedy
    response, in the held-out order."""
    params = load_params(project / "params.yaml")
    tests = {example.prompt: example for example in read_examples(project / "artifacts/data/test.jsonl")}
    found = {}
    for target in PIPELINES[pipeline].stages(params):
        evaluation, _, model = target.partition("@")
        if evaluation.startswith("eval_"):  # a round's: eval_sft_rs@1 evaluates sft_rs/1
            evaluation, model = "eval", f"{evaluation.removeprefix('eval_')}/{model or next(iter(params.rounds))}"
        if evaluation not in ("eval", "agent_eval"):
            continue
        metrics = json.loads((project / f"metrics/{evaluation}/{model}/metrics.json").read_text())
        rows = greedy_rows(project, evaluation, model) if evaluation == "eval" else []
        found[model] = metrics | {
            "correct": [row["correct"] for row in rows],
            "gold": [gold_utility(tests[row["prompt"]], row["response"]) for row in rows],
        }
    return found


def summary(found: dict[str, dict]) -> dict[str, dict]:
    table = {}
    for model, result in found.items():
        n = max(1, len(result["correct"]))
        p = result["pass@1"]
        row = {"pass@1": p, "pass@1_se": math.sqrt(p * (1 - p) / n), "gold_reward": result["gold_reward"]}
        if len(result["gold"]) > 1:
            row |= {"greedy_gold": statistics.mean(result["gold"])}
            row |= {"greedy_gold_se": statistics.stdev(result["gold"]) / math.sqrt(len(result["gold"]))}
        start = STARTS.get(model)
        if start in found and result["correct"] and found[start]["correct"]:
            row["start"] = start
            row["pass@1_gain"], row["pass@1_gain_se"] = paired_gap(result["correct"], found[start]["correct"])
            row["gold_gain"], row["gold_gain_se"] = paired_gap(result["gold"], found[start]["gold"])
        table[model] = row
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", choices=PIPELINES)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=None, help="where the clones stay (default: a new temp dir)")
    parser.add_argument(
        "--in-project",
        type=Path,
        help="run in this project (one seed), e.g. another pipeline's clone: the stages they share are not rerun",
    )
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE params on top of examples/smollm2.args")
    args = parser.parse_args()
    if args.in_project is not None and len(args.seeds) > 1:
        parser.error("--in-project runs one seed")
    out = args.out or Path(tempfile.mkdtemp(prefix="real-pipelines-"))
    out.mkdir(parents=True, exist_ok=True)  # with --in-project nothing else makes it
    results = []
    for seed in args.seeds:
        project = args.in_project or out / f"{args.pipeline}_seed{seed}"
        seconds, stages = repro(project, args.pipeline, [f"seed={seed}", *args.overrides])
        table = summary(evaluations(project, args.pipeline))
        results.append({"pipeline": args.pipeline, "seed": seed, "seconds": round(seconds, 1), "stages": stages})
        results[-1]["models"] = table
        print(f"\n{args.pipeline} seed {seed}: {seconds / 60:.1f} min; stages (s): {stages}", flush=True)
        for model, row in table.items():
            line = f"  {model:<14} pass@1 {row['pass@1']:.3f} ± {row['pass@1_se']:.3f}  gold {row['gold_reward']:.3f}"
            if "start" in row:
                line += (
                    f"  vs {row['start']}: pass@1 {row['pass@1_gain']:+.3f} ± {row['pass@1_gain_se']:.3f}, "
                    f"greedy gold {row['gold_gain']:+.3f} ± {row['gold_gain_se']:.3f}"
                )
            print(line, flush=True)
    (out / f"{args.pipeline}.json").write_text(json.dumps(results, indent=1))
    print(f"\nresults: {out / f'{args.pipeline}.json'}")


if __name__ == "__main__":
    main()
