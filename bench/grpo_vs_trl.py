"""GRPO speed against TRL's GRPOTrainer, side by side: the same model, prompts, rewards, group size and batch.

1. A scratch clone of this repo builds the default data (with 1000 held-out problems, so pass@1 is
   measured to about ±0.016), base model and cold-start SFT model (``alignflow stage data / base /
   sft_cold``): the starting policy of every leg.
2. alignflow: ``alignflow stage grpo`` for ``--steps`` iterations with settings TRL also has (no
   dynamic sampling, one optimizer step per batch of prompts x group, k3 KL loss, clip-higher,
   token-level loss, group-normalised advantages); its step times are its ``time/step`` metric, the
   whole iteration with its bookkeeping.
3. TRL: ``bench/trl_grpo.py`` in a virtual environment with TRL (made under ``.bench/`` on first
   use, so TRL never enters the project's environment), its step times from a callback. Twice: as
   GRPOConfig ships (gradient checkpointing on) and with gradient checkpointing off, which a model
   this small does not need and which makes TRL's step faster.
4. Every final model is evaluated by alignflow's evaluator: greedy pass@1 on the held-out split.

Each leg's first step (warm-up) is left out of its timing. Prints steps/s and tokens/s of every leg,
alignflow's ratio to each TRL leg (target: at least 1.5x TRL's steps/s) and pass@1 after the same
number of steps.

    .venv/bin/python bench/grpo_vs_trl.py [--steps N]
"""

import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from scratch import REPO, cold_start_project, stage, trl_python

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


def _plot(project: Path, name: str) -> list[float]:
    path = project / "metrics/grpo/plots/metrics" / f"{name}.tsv"
    with open(path) as handle:
        return [float(row[name.rsplit("/", 1)[-1]]) for row in csv.DictReader(handle, delimiter="\t")]


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
        "grpo.policy_loss": "token_mean",
        "grpo.advantage": "grpo",
        "grpo.dynamic_sampling": "false",
        "grpo.rewards": f"{{accuracy: 1.0, format: {s['format_weight']}}}",
    }
    stage(project, "grpo", *(f"{key}={value}" for key, value in overrides.items()))
    seconds = _plot(project, "time/step")
    tokens = [length * s["prompts_per_step"] * s["group_size"] for length in _plot(project, "train/response_length")]
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
    from models import load_policy, load_tokenizer
    from tasks.common.params import load_params
    from tasks.data.datasets import read_examples
    from tasks.rollout.hf_engine import HFEngine
    from tasks.stages.eval import evaluate

    params = load_params(project / "params.yaml")
    engine = HFEngine(load_policy(model, torch.device("cpu")), load_tokenizer(model), params.eval.batch_size)
    metrics, _ = evaluate(engine, read_examples(project / "artifacts/data/test.jsonl"), params.eval)
    return metrics["pass@1"]


TRL_LEGS = {"TRL, as shipped (gradient checkpointing)": True, "TRL, gradient checkpointing off": False}


def main(steps: int) -> None:
    trl_python()
    with tempfile.TemporaryDirectory() as scratch:
        project = cold_start_project(Path(scratch) / "project", [f"data.num_test={HELD_OUT}"])
        start = pass_at_1(project, project / "artifacts/sft_cold")
        legs, finals = {"alignflow": alignflow_leg(project, steps)}, {}
        finals["alignflow"] = pass_at_1(project, project / "artifacts/grpo")
        for index, (name, checkpointing) in enumerate(TRL_LEGS.items()):
            output_dir = Path(scratch) / f"trl-{index}"
            legs[name] = trl_leg(project, steps, output_dir, checkpointing)
            finals[name] = pass_at_1(project, output_dir)

    s = SETTINGS
    print(
        f"\nGRPO, {steps} steps of {s['prompts_per_step']} prompts x {s['group_size']} responses "
        f"(<= {s['max_new_tokens']} tokens), one optimizer step each; timing leaves out step 1; "
        f"greedy pass@1 on {HELD_OUT} held-out problems, {start:.3f} before training"
    )
    rates = {}
    for name, (seconds, tokens) in legs.items():
        rates[name] = (1 / statistics.mean(seconds[1:]), sum(tokens[1:]) / sum(seconds[1:]))
        print(f"  {name:<42} {rates[name][0]:6.3f} steps/s  {rates[name][1]:8.0f} tokens/s  pass@1 {finals[name]:.3f}")
    for name in TRL_LEGS:
        steps_ratio, tokens_ratio = (rates["alignflow"][i] / rates[name][i] for i in (0, 1))
        print(
            f"alignflow / {name}: {steps_ratio:.2f}x steps/s, {tokens_ratio:.2f}x tokens/s (target: >= 1.5x steps/s); "
            f"pass@1 {finals['alignflow'] - finals[name]:+.3f}"
        )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(int(arguments[1]) if arguments[:1] == ["--steps"] else 100)
