"""``bench.trl.grpo --model-config DIR``: GRPO iterations, alignflow's against TRL's GRPOTrainer, in one process
(on a GPU, or ``--device cpu`` for a dry run), for a machine without DVC, Ray or a TRL environment of its own:
SmolLM2-135M's architecture and tokenizer (random weights, seeded and saved once, which both legs load: speed does
not depend on them), LoRA rank 16, alpha 32, dropout 0 on every linear layer, fp32 weights and AdamW with the
forward passes under bfloat16 autocast (alignflow's bf16-mixed; TRL's ``bf16=True``, accelerate's autocast over fp32
weights), sampling included (``--sampling fp32``: TRL samples outside autocast, as it ships), 2-digit
additions (``tasks.data.problems.arithmetic``, seeded) through the chat template with the system prompt "Solve the
problem.", 16 prompts x 8 per step, up to 40 new tokens at temperature 1, one optimizer step per batch at 4e-4, no
KL term, PPO's clip-higher surrogate with the token-level loss (TRL's ``dapo``), rewards accuracy + 0.1 x format by
alignflow's verifier, the same prompts in the same order on both legs (TRL's ``shuffle_dataset`` off).

- alignflow: the ``grpo`` stage's own iteration, the shipped code: its roles placed in this process (``place``:
  ``ActorWorker`` with LoRA, its HF engine sampling from a plain copy of the policy with the adapters merged in, in
  bf16, refreshed after each update), ``collect`` (``tasks/rl/trainer.py``: the rollout, and the verifier's
  rewards in ``RewardScorer``'s process) and ``learn`` (``tasks/rl/policy_gradient.py``: group-normalised
  advantages, one update whose own pass gives π_old, the registered surrogate and aggregation, the guarded step,
  the rollout correction and its metrics); the phases are the trainer's own clock's. Deterministic algorithms as
  the worker sets them (``warn_only``: an op without a deterministic CUDA kernel warns instead of stopping the
  bench; ``--no-deterministic`` turns them off). Those modules load without Ray, DVC or DVCLive, which they import
  where a role runs on Ray or where tracking starts (``tests/test_gpu_bench.py`` runs this bench without them).
- TRL: ``GRPOTrainer`` with transformers' ``generate`` (no vLLM), gradient checkpointing off, ``beta`` 0,
  ``loss_type`` dapo, ``per_device_train_batch_size`` 128, ``steps_per_generation`` 1; its reward functions are
  ``bench.trl.grpo_leg``'s (the same verifier and config), and its prompt ids are checked to be alignflow's. As
  shipped, its generate on a PEFT model runs outside accelerate's autocast (fp32): here it is wrapped in it, unless
  ``--sampling fp32``.

Steps 2..N of each leg are timed (the first is warm-up). Prints and writes to ``--out`` each leg's steps/s and
completion tokens/s, alignflow's phases (sampling, scoring, update), update tokens/s and update MFU (6 x parameters
per real token against the measured bf16 matmul peak), peak memory, and the dtype a LoRA layer's output had while
sampling and while training (the check that both legs ran under bf16 autocast).

Needs TRL and datasets besides the pipeline's model code (``bench/gpu/run.sh`` installs them from ``.whl/``).
"""

import argparse
import contextlib
import gc
import json
import os
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from bench.harness import device_matmul_peak, synchronize
from models import num_parameters
from models.trainable import is_adapted
from tasks.common.config import LoraConfig, Params
from tasks.common.training import epoch_batch
from tasks.data.problems import Example, arithmetic
from tasks.data.prompts import PromptFormat
from tasks.rl.learner import LoopState
from tasks.rl.placement import place
from tasks.rl.policy_gradient import learn, needed_roles
from tasks.rl.rewards import RewardScorer
from tasks.rl.trainer import collect, rollout_metrics

SYSTEM_PROMPT = "Solve the problem."
REWARD_WEIGHTS = {"accuracy": 1.0, "format": 0.1}  # grpo's defaults, as the TRL leg weighs them


def problems(count: int, seed: int) -> list[Example]:
    """``count`` seeded 2-digit additions (examples/smollm2.args' task)."""
    rng, cfg = random.Random(seed), SimpleNamespace(digits=2, ops="+")
    return [arithmetic.generate(rng, cfg) for _ in range(count)]


def dtype_probe(*models: torch.nn.Module) -> tuple[dict[str, str], list[torch.utils.hooks.RemovableHandle]]:
    """The output dtype of layer 0's q_proj (of each model: the policy, and the copy alignflow samples from) in
    no-grad passes (sampling) and in training passes."""
    seen: dict[str, str] = {}

    def hook(module, inputs, output):
        seen.setdefault("training" if torch.is_grad_enabled() else "sampling", str(output.dtype).removeprefix("torch."))

    bases = [model.get_base_model() if is_adapted(model) else model for model in models]
    return seen, [base.model.layers[0].self_attn.q_proj.register_forward_hook(hook) for base in bases]


def memory_gib(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def rates(seconds: list[float], completion_tokens: list[float], rows: int) -> dict:
    """Steps/s, completion tokens/s and mean completion length over steps 2..N (the first step is warm-up)."""
    steps, timed, tokens = len(seconds) - 1, sum(seconds[1:]), sum(completion_tokens[1:])
    return {
        "step_seconds": [round(s, 3) for s in seconds],
        "timed_steps": steps,
        "steps_per_second": round(steps / timed, 3),
        "completion_tokens_per_second": round(tokens / timed),
        "mean_completion_length": round(tokens / steps / rows, 2),
    }


def alignflow_leg(args, model_dir: Path, examples: list[Example], device: torch.device, peak: float) -> dict:
    """The grpo stage's iteration, the shipped code: its roles placed in this process (``place``: the actor with its
    engine), ``collect`` (tasks/rl/trainer.py) rolling out and scoring, ``learn`` (tasks/rl/policy_gradient.py)
    updating; the iteration's phases from the trainer's own clock."""
    defaults = Params()
    cfg = replace(
        defaults.grpo,
        lora=LoraConfig(rank=16, alpha=32.0),
        precision="bf16-mixed",
        actor_lr=args.lr,
        rollout_batch_size=args.prompts,
        group_size=args.group,
        minibatch_size=args.prompts * args.group,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        kl_loss="none",
        warmup_steps=0,
        dynamic_sampling=False,
        rewards=REWARD_WEIGHTS,
        steps=args.steps,
    )
    assert cfg.advantage == "grpo" and cfg.policy_loss == "ppo" and cfg.loss_agg_mode == "token_mean"
    task = replace(defaults.task, system_prompt=SYSTEM_PROMPT)
    params = replace(defaults, seed=args.seed, device=device.type, task=task, grpo=cfg)
    roles = place(params, cfg, model_dir, [], needed_roles(cfg))
    # the worker picks deterministic kernels, as a stage does; warn_only: an op without a deterministic CUDA kernel
    # warns instead of stopping the bench
    torch.use_deterministic_algorithms(args.deterministic, warn_only=True)
    actor = roles.actor.local
    parameters = num_parameters(model_dir)  # the model's own, as the stage's MFU counts them (no adapters)
    seen, probes = dtype_probe(actor.model, actor.sampler)
    state = LoopState(kl_coef=cfg.kl_coef)
    steps = []
    with RewardScorer(cfg.rewards, cfg.reward_timeout_seconds) as scorer:
        for step in range(args.steps):
            clock = dict.fromkeys(("time/generate", "time/score", "time/train"), 0.0)
            synchronize()
            started = time.perf_counter()
            rollout, _ = collect(roles, scorer, examples, cfg, state, args.seed, clock)
            metrics = learn(roles, rollout, actor.tokenizer, cfg, state, clock)
            state.step += 1
            synchronize()
            steps.append(
                {
                    "seconds": time.perf_counter() - started,
                    "sample_seconds": clock["time/generate"],
                    "score_seconds": clock["time/score"],
                    "update_seconds": clock["time/train"],
                    "completion_tokens": sum(len(c.token_ids) for c in rollout.completions),
                    "update_tokens": rollout.tokens(),
                    **rollout_metrics(rollout),
                    **metrics,
                }
            )
            print(f"alignflow step {step + 1}: {steps[-1]['seconds']:.3f} s", flush=True)
    for probe in probes:
        probe.remove()
    roles.close()
    timed = steps[1:]
    update_seconds, update_tokens = sum(s["update_seconds"] for s in timed), sum(s["update_tokens"] for s in timed)
    result = rates([s["seconds"] for s in steps], [s["completion_tokens"] for s in steps], len(rollout.completions))
    result |= {
        "sample_seconds_per_step": round(sum(s["sample_seconds"] for s in timed) / len(timed), 4),
        "score_seconds_per_step": round(sum(s["score_seconds"] for s in timed) / len(timed), 4),
        "update_seconds_per_step": round(update_seconds / len(timed), 4),
        "update_tokens_per_second": round(update_tokens / update_seconds),
        "update_mfu": round(6 * parameters * update_tokens / update_seconds / peak, 4),
        "update_real_tokens_per_step": round(update_tokens / len(timed)),
        "logprob_parity": round(sum(s["logprob_parity"] for s in timed) / len(timed), 5),
        "mean_reward": round(sum(s["reward"] for s in steps) / len(steps), 4),
        "last_step": {k: round(v, 5) if isinstance(v, float) else v for k, v in steps[-1].items()},
        "layer_output_dtype": seen,
        "deterministic_algorithms": args.deterministic,
        "peak_memory_gib": memory_gib(device),
    }
    torch.use_deterministic_algorithms(False)
    return result


def trl_leg(args, model_dir: Path, examples: list[Example], device: torch.device, out_dir: Path) -> dict:
    import peft
    import trl
    from datasets import Dataset

    from bench.trl.grpo_leg import check_prompt_ids, grpo_trainer, logged
    from bench.trl.legs import StepTimer

    torch.manual_seed(args.seed)
    messages = PromptFormat("auto", SYSTEM_PROMPT).messages
    dataset = Dataset.from_list(
        [
            {"prompt": messages(e.prompt), "question": e.prompt, "answer": e.answer, "task": e.task, "meta": "{}"}
            for e in examples
        ]
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    completions = args.prompts * args.group
    settings = {
        "output_dir": str(out_dir),
        "steps": args.steps,
        "prompts_per_step": args.prompts,
        "group_size": args.group,
        "max_new_tokens": args.max_new_tokens,
        "lr": args.lr,
        "warmup_steps": 0,
        "kl_coef": 0.0,
        "clip_low": 0.2,
        "clip_high": 0.28,
        "format_weight": REWARD_WEIGHTS["format"],
        "shuffle": False,
        "device": device.type,
        "bf16": True,
        "seed": args.seed,
        "gradient_checkpointing": False,
        "lora": {"rank": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["all-linear"]},
    }

    timer = StepTimer()
    trainer = grpo_trainer(settings, dataset, tokenizer, model, timer)
    expected = PromptFormat("auto", SYSTEM_PROMPT).encode(tokenizer, [e.prompt for e in examples[:4]])
    check_prompt_ids(tokenizer, dataset, expected)
    seen, (probe,) = dtype_probe(trainer.model)
    # --sampling bf16: the whole run under the accelerator's bf16 autocast, sampling included. As shipped,
    # transformers' generate on a PEFT model runs outside it (accelerate wraps the PEFT model's forward, which
    # generate does not call), in the fp32 weights' precision; the training passes are under it either way.
    with trainer.accelerator.autocast() if args.sampling == "bf16" else contextlib.nullcontext():
        trainer.train()
    probe.remove()
    lengths, rewards_logged = logged(trainer, "completions/mean_length"), logged(trainer, "reward")
    if len(lengths) != len(timer.seconds):
        raise SystemExit(f"TRL logged {len(lengths)} steps' lengths for {len(timer.seconds)} timed steps")
    result = rates(timer.seconds, [length * completions for length in lengths], completions)
    result |= {
        "mean_reward": round(sum(rewards_logged) / max(1, len(rewards_logged)), 4),
        "layer_output_dtype": seen,
        "trl": trl.__version__,
        "peft": peft.__version__,
        "peak_memory_gib": memory_gib(device),
    }
    del trainer, model
    return result


def run(args: argparse.Namespace) -> None:
    """Both legs in this process on ``args.model_config``'s architecture, as ``bench.trl.grpo --model-config``."""
    args = argparse.Namespace(**{**vars(args), "steps": args.steps or 6, "prompts": args.prompts or 16})
    if args.steps < 2:
        raise SystemExit("--steps: at least 2 (the first is warm-up)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.trl.grpo --device cuda: no CUDA device is visible")
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts, as make_deterministic
    device = torch.device(args.device)
    legs = args.legs.split(",")
    started = time.perf_counter()
    import transformers

    peak = device_matmul_peak(device)
    free(device)  # each leg's peak memory is its own
    examples = problems(args.steps * args.prompts, args.seed)
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "bf16_matmul_peak_tflops": round(peak / 1e12, 1),
        "settings": {
            "model": "SmolLM2-135M architecture, random weights (seeded, saved once, loaded by both legs)",
            "lora": "rank 16, alpha 32, dropout 0, all-linear",
            "precision": "fp32 weights and AdamW, bf16 autocast over the training passes, on both legs",
            "sampling_precision": {
                "alignflow": "a merged bf16 copy of the policy, as the stage samples",
                "trl": "bf16 autocast" if args.sampling == "bf16" else "fp32 (no autocast)",
            },
            "task": "2-digit additions through the chat template, system prompt 'Solve the problem.'",
            "steps": args.steps,
            "prompts_per_step": args.prompts,
            "group_size": args.group,
            "max_new_tokens": args.max_new_tokens,
            "temperature": 1.0,
            "lr": args.lr,
            "kl": "none (TRL beta 0)",
            "loss": "PPO clip 0.2 / 0.28, token-level mean (TRL dapo), group-normalised advantages",
            "rewards": REWARD_WEIGHTS,
            "timed": "steps 2..N of each leg",
        },
    }
    with tempfile.TemporaryDirectory(prefix="gpu_grpo_") as scratch:
        model_dir = Path(scratch) / "init"
        torch.manual_seed(args.seed)
        config = AutoConfig.from_pretrained(args.model_config)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(model_dir)
        AutoTokenizer.from_pretrained(args.model_config).save_pretrained(model_dir)
        if "alignflow" in legs:
            result["alignflow"] = alignflow_leg(args, model_dir, examples, device, peak)
            free(device)
        if "trl" in legs:  # each step's prompts in the order collect draws them
            order = [i for step in range(args.steps) for i in epoch_batch(len(examples), args.prompts, step, args.seed)]
            result["trl"] = trl_leg(args, model_dir, [examples[i] for i in order], device, Path(scratch) / "trl")
            free(device)
    if "alignflow" in result and "trl" in result:
        result["alignflow_over_trl_steps_per_second"] = round(
            result["alignflow"]["steps_per_second"] / result["trl"]["steps_per_second"], 3
        )
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
