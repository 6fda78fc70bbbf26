"""What the agent pipeline gives: `alignflow repro agent` run as a user runs it, in scratch clones of this repo.

Three questions, one a subcommand:

  tools    the calculator (3-digit x 2-digit products) with its tool against the same pipeline and budget without
           it (``examples.calculator.no_tools``: the same problems from the same seed, each trace the answer alone);
           the time of the tool run, held-out pass@1 of agent_sft and agent_grpo in each, the gap.
  game     the number-guessing game (``@examples/guess_number/game.args``) for each ``--seeds``: held-out success
           (pass@1: the greedy episode's last guess is the number) of agent_sft and of agent_grpo, the gain, and the
           mean turns of the won games, from each eval's ``episodes.jsonl``.
  textarena  the same for TextArena's GuessTheNumber-v0-hardcore (``@examples/textarena/hardcore.args``): a number
           in 1..50 within 10 guesses, played by the tiny model; success is a won game.
  smollm2  SmolLM2-135M-Instruct with the calculator on 3-digit additions (``@examples/calculator/smollm2.args``):
           the time, and held-out pass@1 of agent_sft and agent_grpo.

Each run is one clone (kept under ``--out``, default a new temporary directory) and one timed command; the runs
follow each other, never side by side (they would share this machine's cores).

    .venv/bin/python -m bench.learning.agents tools|game|textarena|smollm2 [--seeds 0 1 2] [--out DIR] [KEY=VALUE ...]
"""

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from bench.harness import clone, project_env
from bench.learning.real_model_pipelines import greedy_rows
from bench.learning.stage_gain import gain

MODELS = ("agent_sft", "agent_grpo")


def repro_agent(project: Path, overrides: list[str]) -> float:
    """Clone this repo to ``project`` and run ``alignflow repro agent`` there with ``overrides``: its seconds."""
    clone(project)
    started = time.perf_counter()
    with open(project / "repro.log", "w") as log:
        command = ["alignflow", "repro", "agent", *overrides, "remote.push=false"]  # a scratch run: nothing to share
        subprocess.run(command, cwd=project, env=project_env(project), check=True, stdout=log, stderr=subprocess.STDOUT)
    return time.perf_counter() - started


def evaluation(project: Path, model: str) -> dict[str, float]:
    """``agent_eval@model``'s metrics, with the mean turns of its won greedy episodes (a task without tools or a
    world, the baseline's, answers in one turn: its eval writes greedy.jsonl)."""
    metrics = json.loads((project / f"metrics/agent_eval/{model}/metrics.json").read_text())
    rows = greedy_rows(project, "agent_eval", model)
    won = [row.get("turns", 1) for row in rows if row["correct"]]
    return metrics | {"turns_to_success": statistics.mean(won) if won else float("nan"), "episodes": len(rows)}


def run(name: str, out: Path, overrides: list[str]) -> dict:
    seconds = repro_agent(out / name, overrides)
    result = {"run": name, "overrides": overrides, "seconds": round(seconds, 1)}
    result |= {model: evaluation(out / name, model) for model in MODELS}
    line = "  ".join(f"{model} pass@1={result[model]['pass@1']:.3f}" for model in MODELS)
    print(f"{name:<16} {seconds / 60:5.1f} min  {line}", flush=True)
    return result


def tools(out: Path, overrides: list[str]) -> list[dict]:
    with_tool = run("calculator", out, overrides)
    without = run("no_tools", out, ["agent_data.task=examples.calculator.no_tools", *overrides])
    for model in MODELS:
        gap = with_tool[model]["pass@1"] - without[model]["pass@1"]
        print(f"{model}: pass@1 with the tool {with_tool[model]['pass@1']:.3f}, without {without[model]['pass@1']:.3f}")
        print(f"{model}: the tool adds {gap:+.3f}")
    return [with_tool, without]


# question -> the args file of its game
GAMES = {"game": "examples/guess_number/game.args", "textarena": "examples/textarena/hardcore.args"}


def game(question: str, out: Path, overrides: list[str], seeds: list[int]) -> list[dict]:
    results = []
    for seed in seeds:
        result = run(f"{question}_seed{seed}", out, [f"@{GAMES[question]}", f"seed={seed}", *overrides])
        start, end = result["agent_sft"], result["agent_grpo"]
        compared = gain(out / result["run"], "agent_eval", "agent_grpo", "agent_sft")
        result |= {"gain": asdict(compared)}
        print(
            f"seed {seed}: success {start['pass@1']:.3f} -> {end['pass@1']:.3f} ({compared.gain:+.3f} +- "
            f"{compared.standard_error:.3f} paired; {compared.fixed} games fixed, {compared.broken} broken), turns "
            f"to success {start['turns_to_success']:.2f} -> {end['turns_to_success']:.2f}",
            flush=True,
        )
        results.append(result)
    return results


def smollm2(out: Path, overrides: list[str]) -> list[dict]:
    return [run("smollm2_calculator", out, ["@examples/calculator/smollm2.args", *overrides])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("question", choices=("tools", *GAMES, "smollm2"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="agents-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"runs in {out}", flush=True)
    if args.question == "tools":
        results = tools(out, args.overrides)
    elif args.question in GAMES:
        results = game(args.question, out, args.overrides, args.seeds)
    else:
        results = smollm2(out, args.overrides)
    (out / f"{args.question}.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
