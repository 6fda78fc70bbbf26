"""Where a training step's time goes, by stage (``--stages``, default sft and grpo).

sft and grpo: torch.profiler's per-op times, grouped, beside the wall time, at the defaults; what no op accounts for
is Python and framework overhead. A scratch clone (or ``--project DIR``, which has them) builds the default data,
base model and cold-start SFT model. Then, in this process, at the stages' defaults (params.yaml):

- SFT: the sft stage's step from the base model on sft's batches (forward and loss, backward, gradient clipping,
  AdamW), ``--warmup`` steps first, then ``--steps`` profiled;
- GRPO: grpo's roles placed as the stage places them, from sft_cold; ``--warmup`` iterations, then one profiled:
  the rollout (generation, rewards) and the learner (log-prob passes, advantages, update), with the trainer's own
  phase clock beside the op groups.

Also prints the model's size, the real (unpadded) tokens per SFT step and the MFU of the profiled steps:
6 x parameters x real tokens per second / this machine's fp32 matmul peak (``bench.speed.matmul_peak``'s measure).

ppo: the PPO iteration's time split by phase (generate / score / train), per rollout backend (hf always; vllm when
installed), side by side: ``--steps`` iterations after one warm-up, on ``artifacts/sft`` and
``artifacts/reward_model`` of the project in the working directory (run ``alignflow repro rlhf``, or the stages up
to ``reward_model``, first), with param overrides (KEY=VALUE); prints the mean seconds per phase, each phase's
share and the backends' ratios.

dpo: one DPO step of the real model, the dpo stage's step (``PairScorer`` under the stage's autocast, then
``guarded_step``) on SmolLM2 with LoRA, in ``--project DIR`` as ``bench.trl.dpo --model smollm2`` built it, on
``--threads`` threads: timed with the default attention kernel and with the math backend, in bf16-mixed and fp32,
then one bf16-mixed step under ``torch.profiler`` (its ops by their own CPU time).

    .venv/bin/python -m bench.speed.steps [--steps 20] [--warmup 5]
    .venv/bin/python -m bench.speed.steps --stages ppo [--steps 5] [KEY=VALUE ...]   # in a project, as above
    .venv/bin/python -m bench.speed.steps --stages dpo --project DIR [--threads 1]
"""

import argparse
import contextlib
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile, record_function

from bench.harness import cold_start_project, real_overrides
from bench.trl.dpo import COMMON, SETTINGS, drawn_rows, pair_scorer
from models import load_policy, load_tokenizer
from models.trainable import autocast, trainable_policy
from tasks.algos.supervised import sft_loss
from tasks.common.artifacts import DATA_DIR, member_dirs, model_dir
from tasks.common.config import ConfigError
from tasks.common.flops import matmul_peak, mfu
from tasks.common.training import adamw_with_cosine, guarded_step, make_deterministic
from tasks.data.datasets import read_examples
from tasks.data.prompts import BARE
from tasks.params.load import load_params
from tasks.rl import trainer as rl
from tasks.rl.learner import LoopState
from tasks.rl.placement import place, placed
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


PHASES = ("time/generate", "time/score", "time/train")


def rl_iteration(roles, scorer, examples, tokenizer, cfg, state: LoopState, seed: int) -> dict[str, float]:
    """One iteration of an RL stage (collect, then learn) and the seconds of each of its phases."""
    clock = dict.fromkeys(PHASES, 0.0)
    rollout, _ = rl.collect(roles, scorer, examples, cfg, state, seed, clock)
    if rollout is not None:
        learn(roles, rollout, tokenizer, cfg, state, clock)
    return clock


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
            clock.update(rl_iteration(roles, scorer, examples, tokenizer, cfg, state, params.seed))

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


def ppo_phases(backend: str, steps: int, overrides: list[str]) -> dict[str, float]:
    params = load_params("params.yaml", [*overrides, f"ppo.rollout_backend={backend}"])
    make_deterministic(params.seed)
    cfg, examples, tokenizer = params.ppo, read_examples(DATA_DIR / "train.jsonl"), load_tokenizer(model_dir("sft"))
    roles = place(params, cfg, model_dir("sft"), member_dirs(), needed_roles(cfg))
    state, scorer = LoopState(kl_coef=cfg.kl_coef), RewardScorer(cfg.rewards, cfg.reward_timeout_seconds)
    samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for step in range(steps + 1):
        clock = rl_iteration(roles, scorer, examples, tokenizer, cfg, state, params.seed)
        if step > 0:  # the first iteration warms caches and the engine up
            for phase in PHASES:
                samples[phase].append(clock[phase])
    return {phase: statistics.mean(values) for phase, values in samples.items()}


def ppo_by_backend(steps: int, overrides: list[str]) -> None:
    backends = ["hf"]
    if find_spec("vllm"):
        try:
            load_params("params.yaml", [*overrides, "ppo.rollout_backend=vllm"])
            backends.append("vllm")
        except ConfigError as error:
            print(f"vllm skipped: {error}")
    results = {backend: ppo_phases(backend, steps, overrides) for backend in backends}
    print(f"PPO iteration, mean of {steps} after one warm-up, seconds per phase")
    print(f"  {'backend':<8}" + "".join(f"{phase[5:]:>18}" for phase in PHASES) + f"{'total':>10}")
    for backend, phases in results.items():
        total = sum(phases.values())
        cells = "".join(f"{seconds:8.3f} ({seconds / total:4.0%})   " for seconds in phases.values())
        print(f"  {backend:<8}{cells}{total:8.3f}")
    if "vllm" in results:
        for phase in PHASES:
            print(f"  vllm / hf {phase[5:]:<9} {results['vllm'][phase] / results['hf'][phase]:.2f}x")


def dpo_step_profile(project: Path, threads: int) -> None:
    torch.set_num_threads(threads)
    os.chdir(project)  # the stage's paths (artifacts/...) are relative to the project
    dpo = {**COMMON, **SETTINGS["smollm2"], "dpo.max_steps": 8}
    params = load_params(project / "params.yaml", [*real_overrides(), *(f"{k}={v}" for k, v in dpo.items())])
    cfg = params.dpo
    scorer, pairs, _ = pair_scorer(project, "train", params)
    model = trainable_policy(project / "artifacts/sft_cold", torch.device("cpu"), cfg).train()
    optimizer, _ = adamw_with_cosine(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps, 8)
    batches = drawn_rows(len(pairs), 8, params)

    def step(rows: list[int], precision: str, backend: SDPBackend | None) -> tuple[float, float]:
        started = time.perf_counter()
        with autocast(model, precision), sdpa_kernel(backend) if backend else contextlib.nullcontext():
            losses = scorer(model, rows)[0]
        forward = time.perf_counter()
        guarded_step(model, optimizer, losses.mean(), cfg.grad_clip, "bench step")
        return forward - started, time.perf_counter() - forward

    step(batches[0], cfg.precision, None)  # warm-up
    variants = [("bf16-mixed", None), ("bf16-mixed", SDPBackend.MATH), ("fp32", None)] * 2
    for index, (precision, backend) in enumerate(variants):
        forward, backward = step(batches[1 + index % 6], precision, backend)
        kernel = "math" if backend else "default"
        print(f"{precision:10s} attention {kernel:7s} forward {forward:.2f} s, backward and step {backward:.2f} s")
    with torch.profiler.profile() as profile:
        step(batches[7], "bf16-mixed", None)
    print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", nargs="+", choices=("sft", "grpo", "ppo", "dpo"), default=["sft", "grpo"])
    parser.add_argument("--steps", type=int, help="profiled sft steps (default 20), timed ppo iterations (5)")
    parser.add_argument("--warmup", type=int, default=5, help="sft steps and grpo iterations before the profiled")
    parser.add_argument("--project", type=Path, help="sft, grpo: a project with sft_cold built; dpo: required")
    parser.add_argument("--threads", type=int, default=1, help="dpo's torch threads")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="ppo's param overrides")
    args = parser.parse_args()
    if "ppo" in args.stages:
        ppo_by_backend(args.steps or 5, args.overrides)
    if "dpo" in args.stages:
        if args.project is None:
            raise SystemExit("--stages dpo: --project DIR, as bench.trl.dpo --model smollm2 built it")
        dpo_step_profile(args.project.resolve(), args.threads)
    profiled_stages = [name for name in ("sft", "grpo") if name in args.stages]
    if not profiled_stages:
        return
    with tempfile.TemporaryDirectory() as scratch:
        project = args.project or cold_start_project(Path(scratch) / "project")
        params = load_params(project / "params.yaml")
        if "sft" in profiled_stages:
            sft_step_profile(project, params, args.steps or 20, args.warmup)
        if "grpo" in profiled_stages:
            grpo_iteration_profile(project, params, args.warmup)


if __name__ == "__main__":
    main()
