"""On-policy distillation speed against TRL's GKDTrainer, side by side: the same student, teacher, prompts, batch,
generation length, temperature, divergence and number of optimizer steps.

1. A project where ``alignflow stage`` ran data, base, sft_cold, grpo, teacher_data, student_base and sft_distill:
   the teacher is the R1 pipeline's GRPO checkpoint (``artifacts/grpo``), the student the SFT student
   (``artifacts/sft_distill``). A scratch clone of this repo builds one (about 8 minutes) unless ``--project``
   names one, which is only read. Both legs train on the same first ``steps x batch`` training prompts, each
   seen once (alignflow's epoch order and TRL's sampler each shuffle them).
2. alignflow: the distill stage's iteration in this process, the roles colocated as ``place`` puts them, once per
   ``--decoding`` (the engine's decoding step: eager, the default on a CPU, or compiled; the compiled leg's first
   step compiles it):
   ``collect`` (the student samples one response per prompt through its rollout engine, and the stage's
   rule-based rewards score them in their own process, as the stage pays for them, though at ``reward_coef`` 0
   they train nothing) and ``learn_distillation`` (the teacher's logits over the vocabulary, then one actor step
   on the gkd divergence).
3. TRL: ``bench.trl.gkd_leg`` in the TRL environment of the benches (lmbda 1: every step generates with the
   student, one completion per prompt), as GKDConfig ships (gradient checkpointing on, which also turns the KV
   cache off in its generation) and with gradient checkpointing off.
4. Unless ``--no-eval``: greedy pass@1 of every trained student on the first 200 held-out problems, beside the
   student's and the teacher's before training (a few seconds per model).

Both legs: the generalised JSD at beta 0.5, sampling at temperature 1 (TRL scores the divergence at temperature 1
whatever it samples at, alignflow at the sampling temperature: 1 keeps them the same), <= 64 new tokens, AdamW at
a constant lr 1e-4 without warm-up or weight decay, gradient norm clipped to 1, float32 on CPU, the same torch
thread count (``--threads``). The losses differ in scale only: alignflow divides the JSD by beta (1 - beta)
(4x at beta 0.5) and averages it over the generated tokens; TRL divides its sum by the token count of the
dataset's solutions, which the generated responses replace.

Each leg's first step (warm-up) is left out of its timing. Prints steps/s of every leg, alignflow's time split
(generate; score: the rewards and the teacher's pass; train), its ratio to each TRL leg (target: at least 1.5x)
and, with the evaluation, pass@1.

    .venv/bin/python -m bench.trl.distill [--steps N] [--batch B] [--threads T] [--project DIR] [--no-eval]
        [--decoding eager compiled]
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.harness import cold_start_project, run_trl_leg, stage, trl_python

SETTINGS = {"max_new_tokens": 64, "temperature": 1.0, "beta": 0.5, "lmbda": 1.0, "lr": 1e-4}
TEACHER, STUDENT = "artifacts/grpo", "artifacts/sft_distill"
# after cold_start_project's data, base and sft_cold: the R1 teacher, its verified data, and the SFT student
UPSTREAM = ("grpo", "teacher_data", "student_base", "sft_distill")
HELD_OUT = 200
SEED = 0
TRL_LEGS = {"TRL, as shipped (gradient checkpointing)": True, "TRL, gradient checkpointing off": False}


def build_project(scratch: Path) -> Path:
    """A scratch clone of this repo with every stage up to the SFT student run in it."""
    project = cold_start_project(scratch / "project")
    for name in UPSTREAM:
        stage(project, name)
    return project


def prompt_slice(project: Path, rows: int, out: Path) -> Path:
    """The first ``rows`` training problems, written to ``out``: one epoch of the bench for both legs."""
    with open(project / "artifacts/data/train.jsonl") as source:
        lines = [line for _, line in zip(range(rows), source, strict=False)]
    if len(lines) < rows:
        raise SystemExit(f"{project}/artifacts/data/train.jsonl: {len(lines)} problems, fewer than steps x batch")
    out.write_text("".join(lines))
    return out


def alignflow_leg(
    project: Path, prompts: Path, steps: int, batch: int, decoding: str, out: Path
) -> tuple[list[float], dict]:
    """Step times of ``steps`` distill iterations (collect + learn_distillation) with the engine's ``decoding``
    step, and the time split and mean response length of the steps after the first; the trained student goes to
    ``out``."""
    from models import load_tokenizer
    from tasks.common.training import make_deterministic
    from tasks.data.datasets import read_examples
    from tasks.params.load import load_params
    from tasks.rl.distillation import distill_roles, learn_distillation
    from tasks.rl.learner import LoopState
    from tasks.rl.placement import place
    from tasks.rl.rewards import RewardScorer
    from tasks.rl.trainer import collect

    s = SETTINGS
    overrides = {
        "seed": SEED,
        "device": "cpu",  # as TRL's use_cpu, even where a GPU is visible
        "decoding": decoding,
        "distill.steps": steps,
        "distill.rollout_batch_size": batch,
        "distill.group_size": 1,
        "distill.minibatch_size": batch,
        "distill.epochs": 1,
        "distill.actor_lr": s["lr"],
        "distill.warmup_steps": 0,
        "distill.lr_schedule": "constant",
        "distill.grad_clip": 1.0,
        "distill.temperature": s["temperature"],
        "distill.max_new_tokens": s["max_new_tokens"],
        "distill.distill_loss": "gkd",
        "distill.jsd_beta": s["beta"],
        "distill.lmbda": s["lmbda"],
        "distill.reward_coef": 0.0,
        "distill.kl_loss": "none",
        "distill.sync_every": 1,
        "distill.colocate": "true",
        "distill.dynamic_sampling": "false",
    }
    params = load_params(project / "params.yaml", [f"{key}={value}" for key, value in overrides.items()])
    cfg = params.distill
    student, teacher = project / STUDENT, project / TEACHER
    examples = read_examples(prompts)
    make_deterministic(params.seed)
    roles = place(params, cfg, student, [], distill_roles(cfg), teacher)
    tokenizer, state = load_tokenizer(student), LoopState(kl_coef=cfg.kl_coef)
    seconds, clocks, lengths = [], [], []
    # the trainer's own scorer (a process running the rule-based rewards), closed as train() closes it
    with RewardScorer(cfg.rewards, cfg.reward_timeout_seconds, cfg.reward_failure_warning) as scorer:
        for step in range(steps):
            clock = dict.fromkeys(("time/generate", "time/score", "time/train"), 0.0)
            started = time.perf_counter()
            rollout, _ = collect(roles, scorer, examples, cfg, state, params.seed, clock)
            metrics = learn_distillation(roles, rollout, tokenizer, cfg, state, clock)
            seconds.append(time.perf_counter() - started)
            state.step = step + 1
            clocks.append(clock)
            lengths.append(metrics["response_length"])
    roles.actor.save(out, student).result()
    split = {name.removeprefix("time/"): sum(c[name] for c in clocks[1:]) / sum(seconds[1:]) for name in clocks[0]}
    return seconds, {"split": split, "response_length": statistics.mean(lengths[1:])}


def trl_leg(
    project: Path, prompts: Path, steps: int, batch: int, threads: int, checkpointing: bool, out: Path
) -> list[float]:
    """Step times of TRL's GKDTrainer for ``steps`` steps, from its callback; the trained student goes to ``out``."""
    settings = {
        **SETTINGS,
        "steps": steps,
        "batch_size": batch,
        "seed": SEED,
        "threads": threads,
        "gradient_checkpointing": checkpointing,
        "student": str(project / STUDENT),
        "teacher": str(project / TEACHER),
        "train_file": str(prompts),
        "output_dir": str(out),
    }
    return run_trl_leg("gkd_leg", settings, out.parent / f"{out.name}.json")["step_seconds"]


def pass_at_1(project: Path, model: Path) -> float:
    """Greedy pass@1 of ``model`` on the first HELD_OUT held-out problems, as the eval stage decodes them."""
    from tasks.data.datasets import read_examples
    from tasks.params.load import load_params
    from tasks.rollout.hf_engine import policy_engine
    from tasks.stages.eval import greedy_responses

    params = load_params(project / "params.yaml")
    engine = policy_engine(params, model, {}, "eval")
    examples = read_examples(project / "artifacts/data/test.jsonl")[:HELD_OUT]
    return greedy_responses(engine, examples, params.eval.max_new_tokens)[1][:, 1].float().mean().item()


def main(steps: int, batch: int, threads: int, project: Path | None, evaluate: bool, decodings: list[str]) -> None:
    if steps < 2:
        raise SystemExit("--steps: at least 2 (the first step is warm-up and left out)")
    trl_python()
    torch.set_num_threads(threads)  # TRL's leg sets the same count in its own process
    load = os.getloadavg()[0]
    rates, finals, before = {}, {}, {}
    with tempfile.TemporaryDirectory() as name:
        scratch = Path(name)
        project = project.resolve() if project is not None else build_project(scratch)
        prompts = prompt_slice(project, steps * batch, scratch / "prompts.jsonl")
        if evaluate:
            before = {
                role: pass_at_1(project, project / path) for role, path in (("student", STUDENT), ("teacher", TEACHER))
            }
        splits = {}
        for decoding in dict.fromkeys(decodings):
            name, out = f"alignflow, decoding {decoding}", scratch / f"alignflow-{decoding}"
            seconds, splits[name] = alignflow_leg(project, prompts, steps, batch, decoding, out)
            rates[name] = 1 / statistics.mean(seconds[1:])
            if evaluate:
                finals[name] = pass_at_1(project, out)
        for index, (name, checkpointing) in enumerate(TRL_LEGS.items()):
            out = scratch / f"trl-{index}"
            rates[name] = 1 / statistics.mean(trl_leg(project, prompts, steps, batch, threads, checkpointing, out)[1:])
            if evaluate:
                finals[name] = pass_at_1(project, out)

    s = SETTINGS
    print(
        f"\nOn-policy distillation (gkd, beta {s['beta']}, lmbda {s['lmbda']}), {steps} steps of {batch} prompts x 1 "
        f"response (<= {s['max_new_tokens']} tokens, temperature {s['temperature']}), {threads} torch thread(s); "
        f"timing leaves out step 1; 1-minute load average {load:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    if evaluate:
        start = ", ".join(f"{role} {value:.3f}" for role, value in before.items())
        print(f"greedy pass@1 on the first {HELD_OUT} held-out problems; before training: {start}")
    for name, rate in rates.items():
        quality = f"  pass@1 {finals[name]:.3f}" if evaluate else ""
        print(f"  {name:<42} {rate:6.3f} steps/s{quality}")
    for ours, split in splits.items():
        phases = ", ".join(f"{phase} {share:.0%}" for phase, share in split["split"].items())
        print(f"  {ours}'s step: {phases}; mean response {split['response_length']:.1f} tokens")
    for ours in splits:
        for name in TRL_LEGS:
            quality = f"; pass@1 {finals[ours] - finals[name]:+.3f}" if evaluate else ""
            print(f"{ours} / {name}: {rates[ours] / rates[name]:.2f}x steps/s (target: >= 1.5x){quality}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps of every leg (the first is warm-up)")
    parser.add_argument("--batch", type=int, default=32, help="prompts per step")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both legs")
    parser.add_argument("--project", type=Path, help="a project with the stages up to sft_distill run (only read)")
    parser.add_argument("--no-eval", dest="evaluate", action="store_false", help="skip held-out pass@1")
    parser.add_argument(
        "--decoding", nargs="+", default=["eager"], choices=("eager", "compiled"), help="alignflow's legs' decoding"
    )
    arguments = parser.parse_args()
    main(arguments.steps, arguments.batch, arguments.threads, arguments.project, arguments.evaluate, arguments.decoding)
