"""Where one SFT step and one GRPO iteration spend their time at the defaults: torch.profiler's per-op times,
grouped, beside the wall time; what no op accounts for is Python and framework overhead.

A scratch clone builds the default data, base model and cold-start SFT model. Then, in this process, at the
stages' defaults (params.yaml):

- SFT: the sft stage's step from the base model on sft's batches (forward and loss, backward, gradient clipping,
  AdamW), ``--warmup`` steps first, then ``--steps`` profiled;
- GRPO: grpo's roles placed as the stage places them, from sft_cold; ``--warmup`` iterations, then one profiled:
  the rollout (generation, rewards) and the learner (log-prob passes, advantages, update), with the trainer's own
  phase clock beside the op groups.

Also prints the model's size, the real (unpadded) tokens per SFT step and the MFU of the profiled steps:
6 x parameters x real tokens per second / this machine's fp32 matmul peak (``bench/matmul_peak.py``'s measure).

    .venv/bin/python bench/profile_steps.py [--steps 20] [--warmup 5]
"""

import argparse
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from harness import cold_start_project
from torch.profiler import ProfilerActivity, profile, record_function

from models import load_policy, load_tokenizer
from tasks.common.flops import matmul_peak, mfu
from tasks.common.training import adamw_with_cosine, make_deterministic
from tasks.data.datasets import read_examples
from tasks.data.prompts import BARE
from tasks.params.load import load_params
from tasks.rl import trainer as rl
from tasks.rl.core_algos import sft_loss
from tasks.rl.learner import LoopState
from tasks.rl.placement import placed
from tasks.rl.policy_gradient import learn, needed_roles
from tasks.rl.rewards import RewardScorer
from tasks.stages.sft import SFTBatches

# op name pattern -> group; the first that matches wins
GROUPS = (
    (r"aten::(mm|addmm|bmm|matmul|linear|baddbmm)$", "matmul (linear layers, LM head)"),
    (r"scaled_dot_product|_flash_attention|_efficient_attention", "attention kernel"),
    (r"aten::(_foreach|add_|addcdiv_|addcmul_|lerp_|sqrt|mul_|div_)|adamw|Optimizer", "optimizer and in-place math"),
    (r"softmax|log_softmax|gather|searchsorted|cumsum|multinomial|rand|argmax|topk", "softmax, sampling, gather"),
    (
        r"embedding|index|cat|copy_|to|contiguous|select|slice|view|reshape|expand|clone|empty|zeros|full|fill_",
        "indexing, copies, allocation",
    ),
    (r"aten::", "other elementwise (norms, activations, rotary)"),
)


def _group(name: str) -> str:
    return next((group for pattern, group in GROUPS if re.search(pattern, name)), "other")


def op_groups(prof: profile) -> dict[str, float]:
    """Seconds of self CPU time per op group (top-level threads' ops only: intra-op threads are inside them)."""
    seconds: dict[str, float] = {}
    for event in prof.key_averages():
        if event.key.startswith("ProfilerStep") or not event.key.startswith(("aten::", "Optimizer")):
            continue
        group = _group(event.key)
        seconds[group] = seconds.get(group, 0.0) + event.self_cpu_time_total / 1e6
    return seconds


def table(title: str, wall: float, groups: dict[str, float], phases: dict[str, float] | None = None) -> None:
    print(f"\n{title}: {wall * 1e3:.1f} ms")
    if phases:
        print("| phase | ms | share |\n|---|---|---|")
        for name, seconds in phases.items():
            print(f"| {name} | {seconds * 1e3:.1f} | {seconds / wall:.0%} |")
    print("| op group | ms | share |\n|---|---|---|")
    for name, seconds in sorted(groups.items(), key=lambda item: -item[1]):
        print(f"| {name} | {seconds * 1e3:.1f} | {seconds / wall:.0%} |")
    overhead = wall - sum(groups.values())
    print(f"| Python and framework overhead (no op running) | {overhead * 1e3:.1f} | {overhead / wall:.0%} |")


def profiled(fn: Callable[[], None], repeat: int) -> tuple[float, profile]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        for _ in range(repeat):
            fn()
        wall = time.perf_counter() - started
    return wall, prof


def sft_step_profile(project: Path, params, steps: int, warmup: int) -> None:
    cfg = params.sft
    make_deterministic(params.seed)
    tokenizer = load_tokenizer(project / "artifacts/base")
    batches = SFTBatches(
        read_examples(project / "artifacts/data/train.jsonl"), tokenizer, BARE, cfg, Path("train"), 0, "sft"
    )
    model = load_policy(project / "artifacts/base", torch.device("cpu"))
    model.train()
    optimizer, scheduler = adamw_with_cosine(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps, cfg.max_steps)
    position = {"step": 0, "tokens": 0}

    def step() -> None:
        batch = batches[position["step"]]
        position["step"] += 1
        position["tokens"] += int(batch["attention_mask"].sum())
        with record_function("forward and loss"):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            loss = sft_loss(logits, batch["input_ids"], batch["loss_mask"])
        optimizer.zero_grad(set_to_none=True)
        with record_function("backward"):
            loss.backward()
        with record_function("clip and AdamW"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()

    for _ in range(warmup):
        step()
    position["tokens"] = 0
    wall, prof = profiled(step, steps)
    parameters = sum(p.numel() for p in model.parameters())
    tokens_per_second = position["tokens"] / wall
    phases = {
        event.key: event.cpu_time_total / 1e6
        for event in prof.key_averages()
        if event.key in ("forward and loss", "backward", "clip and AdamW")
    }
    table(
        f"SFT step (batch {cfg.batch_size}, mean of {steps})",
        wall / steps,
        per(op_groups(prof), steps),
        per(phases, steps),
    )
    threads = torch.get_num_threads()
    print(
        f"\nSFT: {parameters:,} parameters, {position['tokens'] / steps:.0f} real tokens per step, "
        f"{tokens_per_second:,.0f} tokens/s, {6 * parameters * tokens_per_second / 1e9:.1f} GFLOP/s of "
        f"{matmul_peak(threads) / 1e9:.1f} peak: MFU {mfu(parameters, position['tokens'], wall, threads):.2f} "
        f"({threads} threads)"
    )


def per(values: dict[str, float], count: int) -> dict[str, float]:
    return {name: value / count for name, value in values.items()}


def grpo_iteration_profile(project: Path, params, warmup: int) -> None:
    cfg = params.grpo
    init = project / "artifacts/sft_cold"
    examples = read_examples(project / "artifacts/data/train.jsonl")
    tokenizer = load_tokenizer(init)
    make_deterministic(params.seed)
    state = LoopState(kl_coef=cfg.kl_coef)
    with placed(params, cfg, init, [], needed_roles(cfg)) as roles, RewardScorer(cfg.rewards, 30.0) as scorer:
        clock: dict[str, float] = {}

        def iteration() -> None:
            clock.clear()
            clock.update(dict.fromkeys(("time/generate", "time/score", "time/train"), 0.0))
            rollout, _ = rl.collect(roles, scorer, examples, cfg, state, params.seed, clock)
            if rollout is not None:
                learn(roles, rollout, tokenizer, cfg, state, clock)

        for _ in range(warmup):
            iteration()
        wall, prof = profiled(iteration, 1)
    phases = {
        "generate (rollout engine)": clock["time/generate"],
        "rewards, log-prob passes, advantages": clock["time/score"],
        "update (forward, backward, AdamW)": clock["time/train"],
    }
    phases["bookkeeping between phases"] = wall - sum(phases.values())
    table(
        f"GRPO iteration ({cfg.rollout_batch_size} prompts x {cfg.group_size}, {cfg.max_new_tokens} new tokens)",
        wall,
        op_groups(prof),
        phases,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        project = cold_start_project(Path(scratch) / "project")
        params = load_params(project / "params.yaml")
        sft_step_profile(project, params, args.steps, args.warmup)
        grpo_iteration_profile(project, params, args.warmup)


if __name__ == "__main__":
    main()
