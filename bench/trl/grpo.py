"""GRPO speed against TRL's GRPOTrainer, side by side: the same model, prompts, rewards, group size and batch.

Three models: ``--model`` (through alignflow's stages, TRL in an environment of its own) or ``--model-config DIR``
(both legs in this process, on a GPU: ``bench.trl.grpo_in_process`` says how):

- ``tiny`` (the default): the built-in tiny model, full fine-tuning in fp32, grpo's defaults where TRL has the
  setting (32 prompts x 8, 64 new tokens, k3 KL 0.001, clip-higher), 1000 held-out problems (pass@1 to about
  +-0.016).
- ``smollm2``: SmolLM2-135M-Instruct with the recipe of ``examples/smollm2.args`` (docs/real-models.md): 2-digit
  additions through its chat template (system prompt "Solve the problem."), a cold start by SFT with LoRA; GRPO with
  LoRA rank 16, alpha 32, dropout 0 on every linear layer, in bf16-mixed, 16 prompts x 8, 40 new tokens, 4e-4 after
  1 warm-up step, no KL term (TRL's beta 0), 500 held-out problems (``harness.real_overrides``).

1. A scratch clone of this repo (``--project DIR``: built there once, then reused) builds the data, base model and
   cold-start SFT model (``alignflow stage data / base / sft_cold``): the starting policy of every leg.
2. alignflow: ``alignflow stage grpo`` for ``--steps`` iterations with settings TRL also has (no dynamic sampling,
   one optimizer step per batch of prompts x group, clip-higher, token-level loss (TRL's ``dapo``),
   group-normalised advantages, the verifier's accuracy and format rewards, weighted 1 and 0.1; with the real
   model, LoRA and bf16-mixed); its step times are the ``total`` column of its ``perf_steps.tsv``, the whole
   iteration with its bookkeeping.
3. TRL: ``bench.trl.grpo_leg`` in a virtual environment with TRL and PEFT (made under ``.bench/`` on first use, so
   TRL never enters the project's environment), its step times from a callback. The same rewards (alignflow's
   verifiers), temperature 1, learning rate, constant schedule after the warm-up, clipping, group size and lengths;
   with the real model the same LoRA (``peft_config``), ``bf16=True`` (on a CPU: bfloat16 autocast over fp32
   weights, as bf16-mixed) and conversational prompts, whose token ids are checked to be alignflow's before
   training; the merged model is saved. Tiny: twice, as GRPOConfig ships (gradient checkpointing on) and with
   gradient checkpointing off, which a model this small does not need and which makes TRL's step faster. Real
   model: gradient checkpointing off only, as on alignflow's side.
4. Every final model is evaluated by alignflow's evaluator: greedy pass@1 on the held-out split (the same problems
   for every leg, so the gap between two legs is also given with its paired standard error).

Each leg's first step (warm-up) is left out of its timing. This machine's speed drifts between legs by more than the
effect measured (TRL's tiny leg alone has measured 1.0 to 1.4 steps/s on different runs), so with ``--rounds N`` the
legs run N times, in rotated order, and the ratios are the medians of each round's. Prints steps/s and tokens/s of
every leg, alignflow's ratio to each TRL leg (target: at least 2.0x TRL with gradient checkpointing off on the tiny
model, 1.5x on the real one) and pass@1 after the same number of steps (target: alignflow's not below TRL's by more
than the noise: 0.02 on the tiny model, twice the paired standard error on the real one; from the first round:
every leg is seeded, so a round's models are the same). ``--threads`` sets every leg's threads.

    .venv/bin/python -m bench.trl.grpo [--steps N] [--rounds N] [--threads N] [--project DIR]
    .venv/bin/python -m bench.trl.grpo --model smollm2 [--steps N] [--rounds N] [--threads N] [--project DIR]
    python -m bench.trl.grpo --model-config DIR [--steps 6] [--out FILE]   # DIR: SmolLM2's config and tokenizer
    python -m bench.trl.grpo --model-config DIR --device cpu --steps 2 --prompts 2 --max-new-tokens 8  # dry run

(``--prompts N`` and ``--heldout-problems N`` shrink a run to a smoke test; its numbers are not the measurement.)
"""

import csv
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

from bench.harness import (
    COLD_START,
    against_bar,
    built_project,
    paired_gap,
    real_overrides,
    real_project,
    run_trl_leg,
    set_threads,
    side_by_side_parser,
    stage,
    trl_python,
)

TINY_HELD_OUT = 1000
TINY_SETTINGS = {  # grpo's defaults in params.yaml, where TRL has the setting
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
TARGET_RATIO = {"tiny": 2.0, "smollm2": 1.5}  # against TRL with gradient checkpointing off
TINY_PASS_TOLERANCE = 0.02
CHECKED_PROMPTS = 8  # TRL's token ids of the first prompts checked against alignflow's


def real_settings(grpo, prompts: int | None) -> dict:
    """The recipe's grpo settings (params.grpo), in the terms of TINY_SETTINGS plus LoRA and precision."""
    if set(grpo.rewards) - {"accuracy", "format"}:
        raise SystemExit(f"grpo.rewards {dict(grpo.rewards)}: the TRL leg has the accuracy and format rewards only")
    if grpo.rewards.get("accuracy", 0.0) != 1.0:
        raise SystemExit("grpo.rewards: the TRL leg weighs accuracy 1")
    return {
        "prompts_per_step": prompts or grpo.rollout_batch_size,
        "group_size": grpo.group_size,
        "max_new_tokens": grpo.max_new_tokens,
        "lr": grpo.actor_lr,
        "warmup_steps": grpo.warmup_steps,
        "kl_coef": 0.0 if grpo.kl_loss == "none" else grpo.kl_coef,
        "clip_low": grpo.clip_low,
        "clip_high": grpo.clip_high,
        "format_weight": grpo.rewards.get("format", 0.0),
        "lora": {
            "rank": grpo.lora.rank,
            "alpha": grpo.lora.alpha,
            "dropout": grpo.lora.dropout,
            "target_modules": list(grpo.lora.target_modules),
        },
        "precision": grpo.precision,
    }


def _column(path: Path, name: str) -> list[float]:
    with open(path) as handle:
        return [float(row[name]) for row in csv.DictReader(handle, delimiter="\t")]


def alignflow_leg(project: Path, steps: int, s: dict, base: list[str]) -> tuple[list[float], list[float]]:
    from tasks.common.artifacts import CHECKPOINTS

    overrides = {
        "grpo.steps": steps,
        "grpo.rollout_batch_size": s["prompts_per_step"],
        "grpo.group_size": s["group_size"],
        "grpo.minibatch_size": s["prompts_per_step"] * s["group_size"],
        "grpo.epochs": 1,
        "grpo.max_new_tokens": s["max_new_tokens"],
        "grpo.temperature": 1.0,
        "grpo.actor_lr": s["lr"],
        "grpo.warmup_steps": s["warmup_steps"],
        "grpo.lr_schedule": "constant",
        "grpo.kl_loss": "k3" if s["kl_coef"] else "none",
        "grpo.clip_low": s["clip_low"],
        "grpo.clip_high": s["clip_high"],
        "grpo.policy_loss": "ppo",
        "grpo.loss_agg_mode": "token_mean",
        "grpo.advantage": "grpo",
        "grpo.dynamic_sampling": "false",
        "grpo.gradient_checkpointing": "false",
        "grpo.rewards": f"{{accuracy: 1.0, format: {s['format_weight']}}}",
    }
    if s["kl_coef"]:
        overrides["grpo.kl_coef"] = s["kl_coef"]
    if "lora" in s:
        lora = s["lora"]
        overrides |= {
            "grpo.lora.rank": lora["rank"],
            "grpo.lora.alpha": lora["alpha"],
            "grpo.lora.dropout": lora["dropout"],
            "grpo.lora.target_modules": f"[{', '.join(lora['target_modules'])}]",
            "grpo.precision": s["precision"],
        }
    # a run killed in a reused project left its checkpoint: this leg starts fresh, as TRL's does
    shutil.rmtree(project / CHECKPOINTS / "grpo", ignore_errors=True)
    stage(project, "grpo", *base, *(f"{key}={value}" for key, value in overrides.items()))
    seconds = _column(project / "metrics/grpo/perf_steps.tsv", "total")
    lengths = _column(project / "metrics/grpo/plots/metrics/train/response_length.tsv", "response_length")
    tokens = [length * s["prompts_per_step"] * s["group_size"] for length in lengths]
    return seconds, tokens


def prompt_format(project: Path, params) -> dict:
    """How the TRL leg must put the prompts (a conversation when alignflow renders them through the chat template),
    with alignflow's token ids of the first ones, which the TRL leg checks its own against."""
    from models import load_tokenizer
    from tasks.data.datasets import read_examples
    from tasks.data.prompts import PromptFormat

    tokenizer, chosen = load_tokenizer(project / "artifacts/sft_cold"), PromptFormat.of(params.task)
    first = [e.prompt for e in read_examples(project / "artifacts/data/train.jsonl")[:CHECKED_PROMPTS]]
    return {
        "chat": chosen.uses_template(tokenizer),
        "system_prompt": chosen.system_prompt,
        "expected_prompt_ids": chosen.encode(tokenizer, first),
    }


def trl_leg(
    project: Path, steps: int, s: dict, output_dir: Path, checkpointing: bool, prompts: dict
) -> tuple[list[float], list[float]]:
    settings = {
        **s,
        **prompts,
        "bf16": s.get("precision") == "bf16-mixed",
        "gradient_checkpointing": checkpointing,
        "steps": steps,
        "seed": 0,
        "threads": torch.get_num_threads(),
        "model": str(project / "artifacts/sft_cold"),
        "train_file": str(project / "artifacts/data/train.jsonl"),
        "output_dir": str(output_dir),
    }
    if s.get("precision") not in (None, "fp32", "bf16-mixed"):
        raise SystemExit(f"grpo.precision {s['precision']}: the TRL leg has fp32 and bf16 autocast (bf16-mixed)")
    measured = run_trl_leg("grpo_leg", settings, output_dir.parent / f"{output_dir.name}.json")
    tokens = [length * measured["completions_per_step"] for length in measured["mean_lengths"]]
    return measured["step_seconds"], tokens


def greedy_verdicts(project: Path, model: Path, params, limit: int | None) -> list[bool]:
    """Whether alignflow's evaluator finds each of the first ``limit`` held-out problems (all: None) solved by
    ``model``'s greedy response (pass@1 is their mean)."""
    from tasks.data.datasets import read_examples
    from tasks.rollout.hf_engine import policy_engine
    from tasks.stages.eval import greedy_responses

    engine = policy_engine(params, model, {}, "eval")
    examples = read_examples(project / "artifacts/data/test.jsonl")[:limit]
    return greedy_responses(engine, examples, params.eval.max_new_tokens)[1][:, 1].tolist()


def rates(seconds: list[float], tokens: list[float]) -> tuple[float, float]:
    """(steps/s, tokens/s) over every step but the first."""
    return 1 / statistics.mean(seconds[1:]), sum(tokens[1:]) / sum(seconds[1:])


def main(model: str, steps: int, rounds: int, project: Path | None, prompts: int | None, limit: int | None) -> None:
    from tasks.params.load import load_params

    trl_python()
    trl_legs = {"TRL, gradient checkpointing off": False}
    if model == "tiny":
        base = [f"data.num_test={TINY_HELD_OUT}"]
        trl_legs = {"TRL, as shipped (gradient checkpointing)": True, **trl_legs}
    else:
        base = real_overrides()
    legs = ["alignflow", *trl_legs]
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in legs}
    finals: dict[str, list[bool]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        if project is None:
            project = Path(scratch) / "project"
        if model == "tiny":
            built_project(project, COLD_START, base)
        else:
            real_project(project)
        params = load_params(project / "params.yaml", base)
        s = (
            dict(TINY_SETTINGS, prompts_per_step=prompts or 32)
            if model == "tiny"
            else real_settings(params.grpo, prompts)
        )
        form = prompt_format(project, params)
        start = statistics.mean(greedy_verdicts(project, project / "artifacts/sft_cold", params, limit))
        for round_number in range(rounds):
            shift = round_number % len(legs)
            for name in legs[shift:] + legs[:shift]:
                if name == "alignflow":
                    measured[name].append(rates(*alignflow_leg(project, steps, s, base)))
                    final = project / "artifacts/grpo"
                else:
                    final = Path(scratch) / f"trl-{legs.index(name)}"
                    measured[name].append(rates(*trl_leg(project, steps, s, final, trl_legs[name], form)))
                if round_number == 0:
                    finals[name] = greedy_verdicts(project, final, params, limit)
                print(f"round {round_number + 1}: {name:<42} {measured[name][-1][0]:6.3f} steps/s", flush=True)
        held_out = len(finals["alignflow"])

    what = (
        "tiny model, full fine-tuning, fp32"
        if model == "tiny"
        else (f"SmolLM2-135M-Instruct, LoRA rank {s['lora']['rank']} alpha {s['lora']['alpha']}, {s['precision']}")
    )
    kl = f"k3 KL {s['kl_coef']}" if s["kl_coef"] else "no KL term"
    print(
        f"\nGRPO, {what}: {steps} steps of {s['prompts_per_step']} prompts x {s['group_size']} responses "
        f"(<= {s['max_new_tokens']} tokens), one optimizer step each, lr {s['lr']}, {kl}, {rounds} round(s); "
        f"timing leaves out step 1; greedy pass@1 on {held_out} held-out problems, {start:.3f} before training; "
        "medians over rounds"
    )
    for name in legs:
        steps_rate, tokens_rate = (statistics.median(r[i] for r in measured[name]) for i in (0, 1))
        print(
            f"  {name:<42} {steps_rate:6.3f} steps/s  {1 / steps_rate:7.2f} s/step  {tokens_rate:8.0f} tokens/s  "
            f"pass@1 {statistics.mean(finals[name]):.3f}"
        )
    ratios, gaps = {}, {}
    for name in trl_legs:
        per_round = [
            (ours[0] / theirs[0], ours[1] / theirs[1])
            for ours, theirs in zip(measured["alignflow"], measured[name], strict=True)
        ]
        ratios[name] = statistics.median(r[0] for r in per_round)
        gaps[name] = paired_gap(finals["alignflow"], finals[name])
        spread = ", ".join(f"{r[0]:.2f}x" for r in per_round)
        print(
            f"alignflow / {name}: {ratios[name]:.2f}x steps/s (rounds: {spread}), "
            f"{statistics.median(r[1] for r in per_round):.2f}x tokens/s; "
            f"pass@1 {gaps[name][0]:+.3f} (paired standard error {gaps[name][1]:.3f})"
        )
    peer = list(trl_legs)[-1]
    gap, error = gaps[peer]
    tiny_tolerance = TINY_PASS_TOLERANCE if model == "tiny" else None
    verdict, tolerance = against_bar(ratios[peer], TARGET_RATIO[model], gap, error, tiny_tolerance)
    print(
        f"target: >= {TARGET_RATIO[model]}x steps/s against {peer}, pass@1 not below it by more than "
        f"{tolerance:.3f}: {verdict} ({ratios[peer]:.2f}x, {gap:+.3f})"
    )


if __name__ == "__main__":
    parser = side_by_side_parser(__doc__, "GRPO iterations of each leg (default: tiny 100, smollm2 10, in process 6)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--prompts", type=int, help="prompts per step (in process: 16; else fewer than the settings' for a smoke test)"
    )
    parser.add_argument("--heldout-problems", type=int, help="score the first N held-out problems only (smoke test)")
    in_process = parser.add_argument_group("in process (--model-config)")
    in_process.add_argument("--model-config", type=Path, help="both legs in this process, on this architecture")
    in_process.add_argument("--out", type=Path, help="the result as JSON")
    in_process.add_argument("--device", default="cuda", help="cpu: a dry run, small sizes")
    in_process.add_argument("--group", type=int, default=8)
    in_process.add_argument("--max-new-tokens", type=int, default=40)
    in_process.add_argument("--lr", type=float, default=4e-4)
    in_process.add_argument("--seed", type=int, default=0)
    in_process.add_argument("--legs", default="alignflow,trl")
    in_process.add_argument("--no-deterministic", dest="deterministic", action="store_false")
    in_process.add_argument(
        "--sampling",
        choices=("bf16", "fp32"),
        default="bf16",
        help="TRL samples under bf16 autocast (default) or in the fp32 weights' precision, as it ships (its generate "
        "on a PEFT model runs outside accelerate's autocast); alignflow samples as its stage does, from the merged "
        "bf16 copy",
    )
    arguments = parser.parse_args()
    if arguments.threads:
        set_threads(arguments.threads)
    if arguments.model_config is not None:
        from bench.trl.grpo_in_process import run

        run(arguments)
    else:
        steps = arguments.steps or (100 if arguments.model == "tiny" else 10)
        main(arguments.model, steps, arguments.rounds, arguments.project, arguments.prompts, arguments.heldout_problems)
