"""DPO speed against TRL's DPOTrainer, side by side: the same model, pairs, batch size, loss and schedule.

1. A scratch clone of this repo builds the default data, base model, cold-start SFT model (the policy and
   the reference of every leg), preference pairs and the reference's log-probs (``alignflow stage ...``).
2. alignflow, two legs: the dpo stage's step (``PairScorer`` + ``guarded_step``, what ``fit`` runs each
   step) with the reference's log-probs read from ``dpo_reference``'s artifact, and the same step with a
   frozen reference model run on every batch instead.
3. TRL: ``bench/trl_dpo.py`` in the TRL environment of the benches, with ``precompute_ref_log_probs`` on
   and off; each as DPOConfig ships (gradient checkpointing on) and with gradient checkpointing off (which
   a model this small does not need and which makes TRL faster).
4. Every final model is scored by alignflow's evaluator: held-out preference accuracy (the implicit reward
   margin is positive in the gold judge's order) against the stored reference log-probs.

The precomputation itself (alignflow's dpo_reference stage, TRL's pass before training) is left out of
both sides' timing, as is each leg's first step (warm-up). Prints steps/s of every leg, alignflow's ratio
to each TRL leg in the same mode (target: at least 1.5x) and the accuracy gap (target: within 0.02).

    .venv/bin/python bench/dpo_vs_trl.py [--steps N]
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from harness import REPO, cold_start_project, stage, trl_python

SETTINGS = {"batch_size": 64, "lr": 1e-4, "warmup_steps": 20, "weight_decay": 0.01, "beta": 0.1}
MODES = {"precomputed reference": True, "reference run per step": False}


def _scorer(project: Path, split: str, reference_model: torch.nn.Module | None = None):
    """The dpo stage's scorer of ``split`` (the dpo loss, SETTINGS' beta), its pairs, and the tokenizer."""
    from models import context_length, load_tokenizer
    from tasks.common.config import DPOConfig
    from tasks.data.datasets import read_preferences
    from tasks.data.prompts import BARE
    from tasks.rl.preference import tokenize_pairs
    from tasks.stages.dpo import PairScorer, _reference

    init, source = project / "artifacts/sft_cold", project / f"artifacts/preferences/{split}.jsonl"
    tokenizer, pairs = load_tokenizer(init), read_preferences(source)
    tokenized = tokenize_pairs(pairs, tokenizer, BARE, source, context_length(init))
    cfg = DPOConfig(loss="dpo", beta=SETTINGS["beta"], sft_weight=0.0, batch_size=SETTINGS["batch_size"])  # as TRL
    reference = reference_model if reference_model is not None else _reference(split, source, "sft_cold")
    return PairScorer(cfg, tokenized, reference, tokenizer.pad_token_id), pairs


def alignflow_leg(project: Path, steps: int, precomputed: bool, out: Path) -> list[float]:
    from models import load_policy, load_reference, load_tokenizer
    from tasks.common.training import adamw_with_cosine, epoch_batch, guarded_step, make_deterministic

    make_deterministic(0)
    init, cpu = project / "artifacts/sft_cold", torch.device("cpu")
    scorer, pairs = _scorer(project, "train", None if precomputed else load_reference(init, cpu))
    model = load_policy(init, cpu).train()
    s = SETTINGS
    optimizer, scheduler = adamw_with_cosine(model, s["lr"], s["weight_decay"], s["warmup_steps"], steps)
    seconds = []
    for step in range(steps):
        started = time.perf_counter()
        losses = scorer(model, epoch_batch(len(pairs), s["batch_size"], step, 0))[0]
        guarded_step(model, optimizer, losses.mean(), 1.0, f"bench step {step + 1}")
        scheduler.step()
        seconds.append(time.perf_counter() - started)
    model.save_pretrained(out)
    load_tokenizer(init).save_pretrained(out)
    return seconds


def trl_leg(project: Path, steps: int, precomputed: bool, checkpointing: bool, out: Path) -> list[float]:
    settings = {
        **SETTINGS,
        "steps": steps,
        "seed": 0,
        "threads": torch.get_num_threads(),
        "precompute_ref_log_probs": precomputed,
        "gradient_checkpointing": checkpointing,
        "model": str(project / "artifacts/sft_cold"),
        "train_file": str(project / "artifacts/preferences/train.jsonl"),
        "output_dir": str(out),
    }
    result = out.parent / f"{out.name}.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [trl_python(), REPO / "bench/trl_dpo.py", json.dumps(settings), result], cwd=project, env=env, check=True
    )
    return json.loads(result.read_text())["step_seconds"]


def heldout_accuracy(project: Path, model_dir: Path) -> float:
    from models import load_policy
    from tasks.data.judge import preference_metrics

    scorer, pairs = _scorer(project, "test")
    model = load_policy(model_dir, torch.device("cpu")).eval()
    rows = list(range(len(pairs)))
    with torch.no_grad():
        parts = [scorer(model, rows[start : start + 256]) for start in range(0, len(rows), 256)]
    chosen, rejected = (torch.cat([part[column] for part in parts]) for column in (1, 2))
    return preference_metrics(chosen, rejected, pairs)["accuracy"]


TRL_LEGS = {"TRL as shipped (gradient checkpointing)": True, "TRL, gradient checkpointing off": False}


def main(steps: int) -> None:
    trl_python()
    results: dict[str, dict[str, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        project = cold_start_project(Path(scratch) / "project")
        for name in ("preferences", "dpo_reference"):
            stage(project, name)
        os.chdir(project)  # the stage's paths (artifacts/...) are relative to the project
        for mode, precomputed in MODES.items():
            out = Path(scratch) / f"alignflow-{precomputed}"
            seconds = alignflow_leg(project, steps, precomputed, out)
            results[mode] = {"alignflow": (1 / statistics.mean(seconds[1:]), heldout_accuracy(project, out))}
            for name, checkpointing in TRL_LEGS.items():
                out = Path(scratch) / f"trl-{precomputed}-{checkpointing}"
                seconds = trl_leg(project, steps, precomputed, checkpointing, out)
                results[mode][name] = (1 / statistics.mean(seconds[1:]), heldout_accuracy(project, out))

    s = SETTINGS
    print(
        f"\nDPO (sigmoid, beta {s['beta']}), {steps} steps of {s['batch_size']} pairs from the cold-start SFT model; "
        "timing leaves out step 1 and any precomputation; held-out preference accuracy against the gold judge"
    )
    for mode, legs in results.items():
        print(f"{mode}:")
        for name, (rate, accuracy) in legs.items():
            print(f"  {name:<42} {rate:6.3f} steps/s  accuracy {accuracy:.3f}")
        ours, our_accuracy = legs["alignflow"]
        for name in TRL_LEGS:
            rate, accuracy = legs[name]
            print(
                f"  alignflow / {name}: {ours / rate:.2f}x steps/s (target: >= 1.5x); "
                f"accuracy {our_accuracy - accuracy:+.3f} (target: within 0.02)"
            )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(int(arguments[1]) if arguments[:1] == ["--steps"] else 100)
