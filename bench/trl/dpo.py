"""DPO speed against TRL's DPOTrainer, side by side: the same model, pairs, batch size, loss and schedule.

Two models (``--model``):

- ``tiny`` (the default): the built-in tiny model, full fine-tuning in fp32, batches of 64 pairs at 1e-4 after 20
  warm-up steps; both reference modes, and TRL with gradient checkpointing on (as DPOConfig ships) and off.
- ``smollm2``: SmolLM2-135M-Instruct with the recipe of ``examples/smollm2.args`` (docs/real-models.md): prompts
  through its chat template; LoRA rank 16, alpha 32, dropout 0 on every linear layer, in bf16-mixed (TRL:
  ``bf16=True``, on a CPU bfloat16 autocast over fp32 weights); batches of 16 pairs at 4e-4 after 2 warm-up
  steps; the precomputed reference only, gradient checkpointing off on both sides.

Both: the sigmoid DPO loss at beta 0.1, no SFT term, weight decay 0.01, cosine decay to 0 at ``--steps``.

1. A scratch clone of this repo (``--project DIR``: built there once, then reused) builds the data, base model,
   cold-start SFT model (the policy and the reference of every leg), preference pairs sampled from it and judged,
   and the reference's log-probs of them (``alignflow stage ... preferences / dpo_reference``).
2. alignflow: the dpo stage's step as its loop ``fit`` runs it (``PairScorer`` under the stage's precision's
   autocast, then ``guarded_step``) on the stage's model (``trainable_policy``: LoRA adapters on the real model),
   with the reference's log-probs read from ``dpo_reference``'s artifact, or (tiny) a frozen reference model run
   on every batch instead.
3. TRL: ``bench.trl.dpo_leg`` in the TRL environment of the benches, with ``precompute_ref_log_probs`` on (and,
   tiny, off), on the pairs alignflow's leg draws in ``--steps`` steps (the same pairs, each side in its own order),
   their prompts rendered as alignflow renders them; the token ids of the first pairs are checked to be
   alignflow's before training. With LoRA, ``peft_config`` (the reference: adapters disabled) and the merged model
   saved.
4. Every final model is scored by alignflow's evaluator: held-out preference accuracy (the implicit reward margin is
   positive in the gold judge's order) against the stored reference log-probs, on the first ``--heldout-pairs``
   held-out pairs (all on the tiny model), the same pairs for every leg.

The precomputation itself (alignflow's dpo_reference stage, TRL's pass before training) is left out of both sides'
timing, as is each leg's first step (warm-up). Prints steps/s of every leg, alignflow's ratio to each TRL leg in the
same mode (target: at least 1.5x) and the accuracy gap (target: alignflow's not below TRL's by more than 0.02 on the
tiny model, by more than twice the paired standard error of the gap on the real one). ``--threads`` sets every leg's
threads.

    .venv/bin/python -m bench.trl.dpo [--steps N] [--threads N] [--project DIR]
    .venv/bin/python -m bench.trl.dpo --model smollm2 [--steps N] [--project DIR] [--heldout-pairs N]
"""

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.harness import (
    COLD_START,
    PREFERENCES,
    against_bar,
    built_project,
    paired_gap,
    real_overrides,
    real_project,
    run_trl_leg,
    set_threads,
    side_by_side_parser,
    trl_python,
)

# Each model's dpo settings (params' dpo section), the same on both sides.
SETTINGS = {
    "tiny": {
        "dpo.batch_size": 64,
        "dpo.lr": 1e-4,
        "dpo.warmup_steps": 20,
    },
    "smollm2": {
        "dpo.batch_size": 16,
        "dpo.lr": 4e-4,
        "dpo.warmup_steps": 2,
        "dpo.lora.rank": 16,
        "dpo.lora.alpha": 32,
        "dpo.lora.dropout": 0.0,
        "dpo.lora.target_modules": "[all-linear]",
        "dpo.precision": "bf16-mixed",
    },
}
COMMON = {
    "dpo.preference_loss": "dpo",  # TRL's sigmoid loss
    "dpo.beta": 0.1,
    "dpo.sft_weight": 0.0,
    "dpo.weight_decay": 0.01,
    "dpo.grad_clip": 1.0,
    "dpo.gradient_checkpointing": "false",
    "dpo.init": "sft_cold",
}
MODES = {"precomputed reference": True, "reference run per step": False}
TINY_TRL_LEGS = {"TRL as shipped (gradient checkpointing)": True, "TRL, gradient checkpointing off": False}
TINY_HELD_OUT_TOLERANCE = 0.02
CHECKED_PAIRS = 8  # TRL's token ids of the first pairs checked against alignflow's


def pair_scorer(project: Path, split: str, params, reference_model: torch.nn.Module | None = None):
    """The dpo stage's scorer of ``split`` (params.dpo's loss), its pairs, and the tokenized pairs."""
    from models import context_length, load_tokenizer
    from tasks.data.datasets import read_preferences
    from tasks.data.prompts import PromptFormat
    from tasks.rl.preference import tokenize_pairs
    from tasks.stages.dpo import PairScorer, stored_reference

    init, source = project / "artifacts/sft_cold", project / f"artifacts/preferences/{split}.jsonl"
    tokenizer, pairs = load_tokenizer(init), read_preferences(source)
    tokenized = tokenize_pairs(pairs, tokenizer, PromptFormat.of(params.task), source, context_length(init))
    reference = reference_model if reference_model is not None else stored_reference(split, source, params.dpo.init)
    return PairScorer(params.dpo, tokenized, reference, tokenizer.pad_token_id), pairs, tokenized


def drawn_rows(num_pairs: int, steps: int, params) -> list[list[int]]:
    """The rows of the training pairs alignflow's leg trains on at each step, as the dpo stage draws them."""
    from tasks.common.training import epoch_batch

    return [epoch_batch(num_pairs, params.dpo.batch_size, step, params.seed) for step in range(steps)]


def alignflow_leg(project: Path, steps: int, precomputed: bool, out: Path, params) -> list[float]:
    from models import load_reference, load_tokenizer
    from models.trainable import autocast, save_model, trainable_policy
    from tasks.common.training import adamw_with_cosine, guarded_step, make_deterministic

    cfg = params.dpo
    make_deterministic(params.seed)
    init, cpu = project / "artifacts/sft_cold", torch.device("cpu")
    scorer, pairs, _ = pair_scorer(project, "train", params, None if precomputed else load_reference(init, cpu))
    model = trainable_policy(init, cpu, cfg).train()
    optimizer, scheduler = adamw_with_cosine(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps, steps)
    seconds = []
    for step, rows in enumerate(drawn_rows(len(pairs), steps, params)):
        started = time.perf_counter()
        with autocast(model, cfg.precision):
            losses = scorer(model, rows)[0]
        guarded_step(model, optimizer, losses.mean(), cfg.grad_clip, f"bench step {step + 1}")
        scheduler.step()
        seconds.append(time.perf_counter() - started)
    save_model(model, out)  # merged, with adapters
    load_tokenizer(init).save_pretrained(out)
    return seconds


def trl_pairs(project: Path, steps: int, params, out: Path) -> list[list[list[int]]]:
    """Write to ``out`` the training pairs alignflow's leg draws in ``steps`` steps (each once), their prompts as the
    model reads them (rendered through the chat template when alignflow uses it); return alignflow's token ids of
    the first of them, for the TRL leg to check its own against."""
    from models import load_tokenizer
    from tasks.data.prompts import PromptFormat

    tokenizer, chosen_format = load_tokenizer(project / "artifacts/sft_cold"), PromptFormat.of(params.task)
    _, pairs, tokenized = pair_scorer(project, "train", params)
    rows = list(dict.fromkeys(row for batch in drawn_rows(len(pairs), steps, params) for row in batch))
    with open(out, "w") as handle:
        for row in rows:
            pair = pairs[row]
            prompt = pair.prompt
            if chosen_format.uses_template(tokenizer):
                messages = chosen_format.messages(prompt)
                prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            handle.write(json.dumps({"prompt": prompt, "chosen": pair.chosen, "rejected": pair.rejected}) + "\n")
    return [[list(ids) for ids in tokenized[row]] for row in rows[:CHECKED_PAIRS]]


def trl_leg(
    project: Path, steps: int, precomputed: bool, checkpointing: bool, out: Path, params, train_file: Path, ids
) -> list[float]:
    cfg = params.dpo
    lora = cfg.lora
    settings = {
        "batch_size": cfg.batch_size,
        "lr": cfg.lr,
        "warmup_steps": cfg.warmup_steps,
        "weight_decay": cfg.weight_decay,
        "beta": cfg.beta,
        "steps": steps,
        "seed": params.seed,
        "threads": torch.get_num_threads(),
        "precompute_ref_log_probs": precomputed,
        "gradient_checkpointing": checkpointing,
        "bf16": cfg.precision == "bf16-mixed",
        "lora": None
        if not lora.rank
        else {
            "rank": lora.rank,
            "alpha": lora.alpha,
            "dropout": lora.dropout,
            "target_modules": list(lora.target_modules),
        },
        "model": str(project / "artifacts/sft_cold"),
        "train_file": str(train_file),
        "expected_ids": ids,
        "output_dir": str(out),
    }
    if cfg.precision not in ("fp32", "bf16-mixed"):
        raise SystemExit(f"dpo.precision {cfg.precision}: the TRL leg has fp32 and bf16 autocast (bf16-mixed)")
    return run_trl_leg("dpo_leg", settings, out.parent / f"{out.name}.json")["step_seconds"]


def heldout_verdicts(project: Path, model_dir: Path, params, limit: int | None) -> tuple[float, list[bool]]:
    """Held-out preference accuracy of ``model_dir`` on the first ``limit`` test pairs (all: None), and whether its
    implicit reward orders each pair as the gold judge does (pairs the judge ties are left out)."""
    from models import load_policy
    from tasks.data.judge import preference_metrics

    scorer, pairs, _ = pair_scorer(project, "test", params)
    pairs = pairs[:limit]
    model = load_policy(model_dir, torch.device("cpu")).eval()
    rows, batch = list(range(len(pairs))), params.dpo.batch_size  # as the stage scores its held-out pairs
    with torch.no_grad():
        parts = [scorer(model, rows[start : start + batch]) for start in range(0, len(rows), batch)]
    chosen, rejected = (torch.cat([part[column] for part in parts]) for column in (1, 2))
    verdicts = [
        bool(ours) == gold
        for ours, gold in zip((chosen > rejected).tolist(), (p.gold_prefers_chosen for p in pairs), strict=True)
        if gold is not None
    ]
    return preference_metrics(chosen, rejected, pairs)["accuracy"], verdicts


def main(model: str, steps: int, project: Path | None, heldout_pairs: int | None) -> None:
    from tasks.params.load import load_params

    trl_python()
    stages = (*COLD_START, *PREFERENCES)
    base = real_overrides() if model == "smollm2" else []
    modes = MODES if model == "tiny" else {"precomputed reference": True}
    trl_legs = TINY_TRL_LEGS if model == "tiny" else {"TRL, gradient checkpointing off": False}
    limit = heldout_pairs if model == "smollm2" else None
    results: dict[str, dict[str, tuple[float, float, list[bool]]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        if project is None:
            project = Path(scratch) / "project"
        real_project(project, stages) if model == "smollm2" else built_project(project, stages, base)
        dpo = {**COMMON, **SETTINGS[model], "dpo.max_steps": steps}
        params = load_params(project / "params.yaml", [*base, *(f"{key}={value}" for key, value in dpo.items())])
        os.chdir(project)  # the stage's paths (artifacts/...) are relative to the project
        train_file = Path(scratch) / "trl-pairs.jsonl"
        ids = trl_pairs(project, steps, params, train_file)
        for mode, precomputed in modes.items():
            out = Path(scratch) / f"alignflow-{precomputed}"
            seconds = alignflow_leg(project, steps, precomputed, out, params)
            results[mode] = {
                "alignflow": (1 / statistics.mean(seconds[1:]), *heldout_verdicts(project, out, params, limit))
            }
            print(f"{mode}: alignflow {results[mode]['alignflow'][0]:.3f} steps/s", flush=True)
            for name, checkpointing in trl_legs.items():
                out = Path(scratch) / f"trl-{precomputed}-{checkpointing}"
                seconds = trl_leg(project, steps, precomputed, checkpointing, out, params, train_file, ids)
                results[mode][name] = (1 / statistics.mean(seconds[1:]), *heldout_verdicts(project, out, params, limit))
                print(f"{mode}: {name} {results[mode][name][0]:.3f} steps/s", flush=True)

    cfg = params.dpo
    what = (
        "tiny model, full fine-tuning, fp32"
        if model == "tiny"
        else (f"SmolLM2-135M-Instruct, LoRA rank {cfg.lora.rank} alpha {cfg.lora.alpha}, {cfg.precision}")
    )
    counted = len(results["precomputed reference"]["alignflow"][2])
    print(
        f"\nDPO (sigmoid, beta {cfg.beta}), {what}: {steps} steps of {cfg.batch_size} pairs at lr {cfg.lr} from the "
        "cold-start SFT model; timing leaves out step 1 and any precomputation; held-out preference accuracy against "
        f"the gold judge on {counted} pairs"
    )
    for mode, legs in results.items():
        print(f"{mode}:")
        for name, (rate, accuracy, _) in legs.items():
            print(f"  {name:<42} {rate:6.3f} steps/s  {1 / rate:7.2f} s/step  accuracy {accuracy:.3f}")
        ours, _, our_verdicts = legs["alignflow"]
        for name in trl_legs:
            rate, _, verdicts = legs[name]
            gap, error = paired_gap(our_verdicts, verdicts)
            tiny_tolerance = TINY_HELD_OUT_TOLERANCE if model == "tiny" else None
            verdict, tolerance = against_bar(ours / rate, 1.5, gap, error, tiny_tolerance)
            print(
                f"  alignflow / {name}: {ours / rate:.2f}x steps/s (target: >= 1.5x); accuracy {gap:+.3f} "
                f"(paired standard error {error:.3f}; target: not below by more than {tolerance:.3f}): {verdict}"
            )


if __name__ == "__main__":
    parser = side_by_side_parser(__doc__, "optimizer steps of each leg (default: tiny 100, smollm2 20)")
    parser.add_argument(
        "--heldout-pairs", type=int, default=1000, help="held-out pairs scored on the real model (default 1000)"
    )
    arguments = parser.parse_args()
    if arguments.threads:
        set_threads(arguments.threads)
    steps = arguments.steps or (100 if arguments.model == "tiny" else 20)
    main(arguments.model, steps, arguments.project, arguments.heldout_pairs)
