"""GRPO speed against TRL's GRPOTrainer, side by side: the same model, prompts, rewards, group size and batch.

1. A scratch clone of this repo builds the default data (with 1000 held-out problems, so pass@1 is
   measured to about ±0.016), base model and cold-start SFT model (``alignflow stage data / base /
   sft_cold``): the starting policy of every leg.
2. alignflow: ``alignflow stage grpo`` for ``--steps`` iterations with settings TRL also has (no
   dynamic sampling, one optimizer step per batch of prompts x group, k3 KL loss, clip-higher,
   token-level loss, group-normalised advantages); its step times are the ``total`` column of its
   ``perf_steps.tsv``, the whole iteration with its bookkeeping.
3. TRL: ``bench/trl_grpo.py`` in a virtual environment with TRL (made under ``.bench/`` on first
   use, so TRL never enters the project's environment), its step times from a callback. Twice: as
   GRPOConfig ships (gradient checkpointing on) and with gradient checkpointing off, which a model
   this small does not need and which makes TRL's step faster.
4. Every final model is evaluated by alignflow's evaluator: greedy pass@1 on the held-out split.

Each leg's first step (warm-up) is left out of its timing. This machine's speed drifts between legs by
more than the effect measured (TRL's leg alone has measured 1.0 to 1.4 steps/s on different runs), so with
``--rounds N`` the legs run N times, in rotated order, and the ratios are the medians of each round's. Prints
steps/s and tokens/s of every leg, alignflow's ratio to each TRL leg (target: at least 2.0x TRL with gradient
checkpointing off) and pass@1 after the same number of steps (target: alignflow's equal or better, within the
measurement's +-0.02; from the first round: every leg is seeded, so a round's models are the same).

    .venv/bin/python bench/grpo_vs_trl.py [--steps N] [--rounds N]
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch
from harness import REPO, cold_start_project, stage, trl_python

HELD_OUT = 1000
SETTINGS = {  # grpo's defaults in params.yaml, where TRL has the setting
    "prompts_per_step": 32,
    "group_size": 8,
    "max_new_tokens": 64,
    "lr": 1e-4,
    "warmup_steps": 5,
    "kl_coef": 0.001,
    "clip_low": 0.2,
    "clip_high": 0.28,
    "format_weight": 0.1,
}


def _column(path: Path, name: str) -> list[float]:
    with open(path) as handle:
        return [float(row[name]) for row in csv.DictReader(handle, delimiter="\t")]


def alignflow_leg(project: Path, steps: int) -> tuple[list[float], list[float]]:
    s = SETTINGS
    overrides = {
        "grpo.steps": steps,
        "grpo.rollout_batch_size": s["prompts_per_step"],
        "grpo.group_size": s["group_size"],
        "grpo.minibatch_size": s["prompts_per_step"] * s["group_size"],
        "grpo.epochs": 1,
        "grpo.max_new_tokens": s["max_new_tokens"],
        "grpo.actor_lr": s["lr"],
        "grpo.warmup_steps": s["warmup_steps"],
        "grpo.kl_loss": "k3",
        "grpo.kl_coef": s["kl_coef"],
        "grpo.clip_low": s["clip_low"],
        "grpo.clip_high": s["clip_high"],
        "grpo.policy_loss": "ppo",
        "grpo.loss_agg_mode": "token_mean",
        "grpo.advantage": "grpo",
        "grpo.dynamic_sampling": "false",
        "grpo.rewards": f"{{accuracy: 1.0, format: {s['format_weight']}}}",
    }
    stage(project, "grpo", *(f"{key}={value}" for key, value in overrides.items()))
    seconds = _column(project / "metrics/grpo/perf_steps.tsv", "total")
    lengths = _column(project / "metrics/grpo/plots/metrics/train/response_length.tsv", "response_length")
    tokens = [length * s["prompts_per_step"] * s["group_size"] for length in lengths]
    return seconds, tokens


def trl_leg(project: Path, steps: int, output_dir: Path, checkpointing: bool) -> tuple[list[float], list[float]]:
    settings = {
        **SETTINGS,
        "gradient_checkpointing": checkpointing,
        "steps": steps,
        "seed": 0,
        "threads": torch.get_num_threads(),
        "model": str(project / "artifacts/sft_cold"),
        "train_file": str(project / "artifacts/data/train.jsonl"),
        "output_dir": str(output_dir),
    }
    result = output_dir.parent / f"{output_dir.name}.json"
    env = {**os.environ, "PYTHONPATH": str(project), "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [trl_python(), REPO / "bench/trl_grpo.py", json.dumps(settings), result], cwd=project, env=env, check=True
    )
    measured = json.loads(result.read_text())
    tokens = [length * measured["completions_per_step"] for length in measured["mean_lengths"]]
    return measured["step_seconds"], tokens


def pass_at_1(project: Path, model: Path) -> float:
    from tasks.common.params import load_params
    from tasks.data.datasets import read_examples
    from tasks.rollout.hf_engine import policy_engine
    from tasks.stages.eval import evaluate

    params = load_params(project / "params.yaml")
    engine = policy_engine(params, model, {}, ("eval.max_new_tokens", params.eval.max_new_tokens))
    metrics, _ = evaluate(engine, read_examples(project / "artifacts/data/test.jsonl"), params.eval)
    return metrics["pass@1"]


TRL_LEGS = {"TRL, as shipped (gradient checkpointing)": True, "TRL, gradient checkpointing off": False}
TARGET_RATIO = 2.0  # against TRL with gradient checkpointing off
PASS_TOLERANCE = 0.02


def rates(seconds: list[float], tokens: list[float]) -> tuple[float, float]:
    """(steps/s, tokens/s) over every step but the first."""
    return 1 / statistics.mean(seconds[1:]), sum(tokens[1:]) / sum(seconds[1:])


def main(steps: int, rounds: int) -> None:
    trl_python()
    legs = ["alignflow", *TRL_LEGS]
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in legs}
    finals = {}
    with tempfile.TemporaryDirectory() as scratch:
        project = cold_start_project(Path(scratch) / "project", [f"data.num_test={HELD_OUT}"])
        start = pass_at_1(project, project / "artifacts/sft_cold")
        for round_number in range(rounds):
            shift = round_number % len(legs)
            for name in legs[shift:] + legs[:shift]:
                if name == "alignflow":
                    measured[name].append(rates(*alignflow_leg(project, steps)))
                    model = project / "artifacts/grpo"
                else:
                    model = Path(scratch) / f"trl-{legs.index(name)}"
                    measured[name].append(rates(*trl_leg(project, steps, model, TRL_LEGS[name])))
                if round_number == 0:
                    finals[name] = pass_at_1(project, model)
                print(f"round {round_number + 1}: {name:<42} {measured[name][-1][0]:6.3f} steps/s", flush=True)

    s = SETTINGS
    print(
        f"\nGRPO, {steps} steps of {s['prompts_per_step']} prompts x {s['group_size']} responses "
        f"(<= {s['max_new_tokens']} tokens), one optimizer step each, {rounds} round(s); timing leaves out step 1; "
        f"greedy pass@1 on {HELD_OUT} held-out problems, {start:.3f} before training; medians over rounds"
    )
    for name in legs:
        steps_rate, tokens_rate = (statistics.median(r[i] for r in measured[name]) for i in (0, 1))
        print(f"  {name:<42} {steps_rate:6.3f} steps/s  {tokens_rate:8.0f} tokens/s  pass@1 {finals[name]:.3f}")
    ratios = {}
    for name in TRL_LEGS:
        per_round = [
            (ours[0] / theirs[0], ours[1] / theirs[1])
            for ours, theirs in zip(measured["alignflow"], measured[name], strict=True)
        ]
        ratios[name] = statistics.median(r[0] for r in per_round)
        spread = ", ".join(f"{r[0]:.2f}x" for r in per_round)
        print(
            f"alignflow / {name}: {ratios[name]:.2f}x steps/s (rounds: {spread}), "
            f"{statistics.median(r[1] for r in per_round):.2f}x tokens/s; "
            f"pass@1 {finals['alignflow'] - finals[name]:+.3f}"
        )
    peer = list(TRL_LEGS)[-1]
    gap = finals["alignflow"] - finals[peer]
    verdict = "meets" if ratios[peer] >= TARGET_RATIO and gap >= -PASS_TOLERANCE else "misses"
    print(
        f"target: >= {TARGET_RATIO}x steps/s against {peer}, pass@1 not below it by more than {PASS_TOLERANCE}: "
        f"{verdict} ({ratios[peer]:.2f}x, {gap:+.3f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    arguments = parser.parse_args()
    main(arguments.steps, arguments.rounds)
