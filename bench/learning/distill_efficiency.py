"""On-policy distillation against more SFT on the teacher's data: held-out pass@1 per student training token.

The claim: from the same SFT student, on-policy distillation reaches the held-out greedy pass@1 that SFT on
the teacher's verified samples ends at with at most a third of the student training tokens. Two legs run in
this process, each from the student ``distill.init`` (``artifacts/sft_distill``), seeded alike:

  sft        more SFT on ``artifacts/teacher_data/train.jsonl`` with ``params.sft_distill``'s settings (lr, batch
             size, warm-up, weight decay, grad clip) and a fresh warm-up + cosine schedule over ``--sft-steps``; the
             data order goes on from where the sft_distill stage stopped. Tokens per step: the batch's response
             tokens, the ones the loss is taken on (its loss mask).
  on_policy  the distill stage's loop with ``params.distill`` (place + collect + learn_distillation; teacher
             ``distill.teacher``) for ``--distill-steps`` iterations. Tokens per iteration: the response tokens the
             student sampled and trains on.

Held-out greedy pass@1 is measured before training (0 tokens: both curves' shared first point) and every
``--sft-every`` steps / ``--distill-every`` iterations (by default about 10 points per curve). The SFT curve's
final pass@1 is the mean of its last two points (one evaluation is noisy); printed are the on-policy tokens at
the first evaluation that reaches it (an upper bound, within one evaluation interval), their ratio to the SFT
leg's total tokens, and whether that is at most 1/3.

``--project DIR`` reuses a project holding those artifacts, evaluated on its ``artifacts/data/test.jsonl``;
nothing is written into it. Otherwise a scratch clone of this repo builds data, base, sft_cold, grpo,
teacher_data, student_base and sft_distill (about 8 minutes) with ``data.num_test=1000`` held-out problems (the
standard error of pass@1 is about 0.03 at the default 200); params overrides (KEY=VALUE) apply to every stage and
to both legs.

Written to ``--out`` (default: a new temporary directory): ``distill_efficiency.json``, every point as
{"method": "sft" | "on_policy", "tokens", "pass@1"}; ``sft.json`` and ``on_policy.json``, one method each; and a
``dvc.yaml`` whose plot draws the two in one chart. DVC's templates colour lines by revision and file, never
by a field, so ``dvc plots show distill_efficiency.json -x tokens -y pass@1 --template linear`` renders one line
through both methods' points; the two curves are ``cd OUT && dvc plots show``.

    .venv/bin/python -m bench.learning.distill_efficiency [--project DIR] [--sft-steps N] [--distill-steps N]
        [--sft-every K] [--distill-every K] [--heldout N] [--threads N] [--out DIR] [KEY=VALUE ...]
"""

import argparse
import json
import math
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from bench.harness import clone, stage
from models import load_policy, load_tokenizer, resolve_device
from tasks.algos.supervised import sft_loss
from tasks.common.artifacts import model_dir
from tasks.common.config import Params
from tasks.common.training import adamw_with_cosine, guarded_step, make_deterministic
from tasks.data.datasets import read_examples
from tasks.data.problems import Example
from tasks.data.prompts import PromptFormat
from tasks.params.load import load_params
from tasks.rl import trainer as rl
from tasks.rl.distillation import distillation_learner
from tasks.rl.learner import LoopState
from tasks.rl.placement import place
from tasks.rl.rewards import RewardScorer
from tasks.rollout.hf_engine import HFEngine
from tasks.stages.eval import greedy_responses
from tasks.stages.sft import SFTBatches

STAGES = ("data", "base", "sft_cold", "grpo", "teacher_data", "student_base", "sft_distill")
HELDOUT_PROBLEMS = 1000  # a scratch project's held-out split: pass@1's standard error about 0.013 instead of 0.03
TEACHER_DATA = Path("artifacts/teacher_data/train.jsonl")
TARGET = 1 / 3  # the claim: on-policy needs at most this fraction of SFT's tokens

Point = tuple[int, int, float]  # (step or iteration, student training tokens so far, held-out greedy pass@1)


def build_project(project: Path, overrides: list[str]) -> Path:
    """Clone this repo to ``project`` and run every stage up to the SFT student there, with ``overrides``."""
    clone(project)
    for name in tqdm(STAGES, desc="building the project"):
        stage(project, name, *overrides)
    return project


def heldout_pass_at_1(model: torch.nn.Module, tokenizer, test: list[Example], params: Params) -> float:
    """Greedy pass@1 of ``model`` as it is now, leaving the random state training draws from as it was."""
    devices = [model.device] if model.device.type == "cuda" else []
    # Greedy decoding draws nothing today; the fork keeps both legs' streams intact should that change.
    # HFEngine.generate switches the model to eval() and back to the mode it found.
    with torch.random.fork_rng(devices=devices):
        engine = HFEngine(model, tokenizer, params.eval.batch_size, PromptFormat.of(params.task))
        verdicts = greedy_responses(engine, test, params.eval.max_new_tokens)[1]
    return verdicts[:, 1].float().mean().item()


def checkpoints(total: int, every: int) -> set[int]:
    """The steps after which a leg is evaluated: every ``every``, and the last."""
    return set(range(every, total + 1, every)) | {total}


def sft_leg(project: Path, params: Params, steps: int, every: int, test: list[Example]) -> list[Point]:
    """Held-out pass@1 against response tokens trained on, over ``steps`` more SFT steps on the teacher's data."""
    make_deterministic(params.seed)
    cfg, init = params.sft_distill, project / model_dir(params.distill.init)
    tokenizer, device = load_tokenizer(init), resolve_device(params.device)
    source = project / TEACHER_DATA
    examples, prompt_format = read_examples(source)[: cfg.num_examples], PromptFormat.of(params.task)
    batches = SFTBatches(examples, tokenizer, prompt_format, cfg, source, params.seed, "sft_distill")
    model = load_policy(init, device).train()
    # A fresh schedule over this leg (a second SFT run from the checkpoint), as the stage's own run had one.
    optimizer, scheduler = adamw_with_cosine(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps, steps)
    evaluate_at, tokens = checkpoints(steps, every), 0
    curve = [(0, 0, heldout_pass_at_1(model, tokenizer, test, params))]
    for step in tqdm(range(steps), desc="sft"):
        # The sft_distill stage saw batches 0 .. max_steps - 1: go on from there, not through its order again.
        batch = {name: tensor.to(device) for name, tensor in batches[cfg.max_steps + step].items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = sft_loss(logits, batch["input_ids"], batch["loss_mask"])
        guarded_step(model, optimizer, loss, cfg.grad_clip, f"sft leg step {step + 1}")
        scheduler.step()
        tokens += int(batch["loss_mask"].sum().item())
        if step + 1 in evaluate_at:
            curve.append((step + 1, tokens, heldout_pass_at_1(model, tokenizer, test, params)))
    return curve


def on_policy_leg(project: Path, params: Params, iterations: int, every: int, test: list[Example]) -> list[Point]:
    """Held-out pass@1 against sampled response tokens trained on, over ``iterations`` of on-policy distillation."""
    make_deterministic(params.seed)
    # colocated: the bench evaluates the actor's model in this process; a cosine schedule spans this leg
    cfg = replace(params.distill, steps=iterations, colocate=True)
    init, teacher = project / model_dir(cfg.init), project / model_dir(cfg.teacher)
    tokenizer = load_tokenizer(init)
    examples = read_examples(project / "artifacts/data/train.jsonl")
    # the stage's learner: with distill.lmbda < 1 some iterations train on the teacher's responses, as there
    prompt_format = PromptFormat.of(params.task)
    learner = distillation_learner(cfg, project / TEACHER_DATA, tokenizer, prompt_format, params.seed)
    roles = place(params, cfg, init, [], learner.roles(cfg), teacher)
    model, state = roles.actor.local.model, LoopState(kl_coef=cfg.kl_coef)
    evaluate_at, tokens = checkpoints(iterations, every), 0
    curve = [(0, 0, heldout_pass_at_1(model, tokenizer, test, params))]
    with RewardScorer(cfg.rewards, cfg.reward_timeout_seconds, cfg.reward_failure_warning) as scorer:
        for iteration in tqdm(range(iterations), desc="on-policy"):
            clock = dict.fromkeys(("time/generate", "time/score", "time/train"), 0.0)
            rollout = learner.offline(iteration) if learner.offline else None
            if rollout is None:
                rollout, _ = rl.collect(roles, scorer, examples, cfg, state, params.seed, clock)
            if rollout is not None:  # None: dynamic sampling kept no group, nothing is trained on
                learner.learn(roles, rollout, tokenizer, cfg, state, clock)
                tokens += sum(len(completion.token_ids) for completion in rollout.completions)
            if iteration + 1 in evaluate_at:
                curve.append((iteration + 1, tokens, heldout_pass_at_1(model, tokenizer, test, params)))
    return curve


def first_reaching(curve: list[Point], target: float) -> Point | None:
    return next((point for point in curve if point[2] >= target), None)


def write_results(out: Path, curves: dict[str, list[Point]]) -> None:
    """The points as JSON rows for ``dvc plots``: all of them, each method's, and a dvc.yaml overlaying the two."""
    out.mkdir(parents=True, exist_ok=True)
    rows = {
        method: [{"method": method, "tokens": tokens, "pass@1": round(value, 6)} for _, tokens, value in curve]
        for method, curve in curves.items()
    }
    (out / "distill_efficiency.json").write_text(json.dumps([row for part in rows.values() for row in part], indent=1))
    for method, part in rows.items():
        (out / f"{method}.json").write_text(json.dumps(part, indent=1))
    # top-level plots: one chart with a line per file (JSON is YAML, so no YAML writer is needed)
    plot = {"template": "linear", "x": "tokens", "y": {f"{method}.json": "pass@1" for method in rows}}
    (out / "dvc.yaml").write_text(json.dumps({"plots": [{"distill_efficiency": plot}]}, indent=1) + "\n")


def report(curves: dict[str, list[Point]], problems: int, available: int, params: Params) -> None:
    cfg = params.distill
    print(
        f"\nheld-out greedy pass@1 on {problems} problems (of artifacts/data/test.jsonl's {available}), "
        f"from {cfg.init}; "
        f"sft: batch {params.sft_distill.batch_size}, lr {params.sft_distill.lr}; on_policy: {cfg.distill_loss}, "
        f"{cfg.rollout_batch_size} prompts x {cfg.group_size}, actor_lr {cfg.actor_lr}, teacher {cfg.teacher}"
    )
    print(f"{'method':<10} {'step':>6} {'tokens':>11} {'pass@1':>7}")
    for method, curve in curves.items():
        for step, tokens, value in curve:
            print(f"{method:<10} {step:>6} {tokens:>11,} {value:>7.3f}")

    sft, on_policy = curves["sft"], curves["on_policy"]
    # the last two checkpoints' mean: one greedy evaluation of one checkpoint moves by a standard error or so
    last = sft[-2:]
    target, sft_tokens = sum(value for *_, value in last) / len(last), sft[-1][1]
    error = math.sqrt(target * (1 - target) / problems)
    print(
        f"\nSFT's final pass@1: {target:.3f} (mean of its last {len(last)} points, steps "
        f"{' and '.join(str(step) for step, *_ in last)}, to damp the noise of one evaluation; a point's standard "
        f"error is about {error:.3f} on {problems} problems), after {sft_tokens:,} student tokens"
    )
    if target <= sft[0][2]:
        print(
            f"more SFT did not raise pass@1 above the start ({sft[0][2]:.3f}): any curve reaches that at 0 tokens; "
            "no ratio, the comparison says nothing about sample efficiency"
        )
        return
    reached = first_reaching(on_policy, target)
    if reached is None:
        best = max(value for *_, value in on_policy)
        print(
            f"the on-policy curve never reaches {target:.3f}: {on_policy[-1][0]} iterations, "
            f"{on_policy[-1][1]:,} student tokens, best pass@1 {best:.3f}; no ratio, the claim is not shown"
        )
        return
    iteration, tokens, value = reached
    ratio = tokens / sft_tokens
    print(
        f"the on-policy curve first reaches it at iteration {iteration} ({value:.3f}), after {tokens:,} student "
        f"tokens (its first evaluation at or above it: an upper bound, within one evaluation interval)"
    )
    verdict = "yes" if ratio <= TARGET else "no"
    print(f"ratio on-policy tokens / SFT tokens: {ratio:.3f}; at most 1/3: {verdict}")


def main(arguments: argparse.Namespace, overrides: list[str]) -> None:
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    out = arguments.out or Path(tempfile.mkdtemp(prefix="distill_efficiency-"))
    with tempfile.TemporaryDirectory() as scratch:
        if arguments.project:
            project = arguments.project.resolve()
        else:
            # held-out size first, so an override of data.num_test on the command line wins
            overrides = [f"data.num_test={HELDOUT_PROBLEMS}", *overrides]
            project = build_project(Path(scratch) / "project", overrides)
        params = load_params(project / "params.yaml", overrides)
        heldout = read_examples(project / "artifacts/data/test.jsonl")
        test = heldout[: arguments.heldout]
        sft_steps = arguments.sft_steps or params.sft_distill.max_steps
        sft_every = arguments.sft_every or max(1, sft_steps // 10)
        distill_every = arguments.distill_every or max(1, arguments.distill_steps // 10)
        curves = {
            "sft": sft_leg(project, params, sft_steps, sft_every, test),
            "on_policy": on_policy_leg(project, params, arguments.distill_steps, distill_every, test),
        }
    report(curves, len(test), len(heldout), params)
    write_results(out, curves)
    print(f"\npoints: {out / 'distill_efficiency.json'}; both curves in one chart: cd {out} && dvc plots show")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, help="a project with the artifacts (read only); default: build one")
    parser.add_argument("--sft-steps", type=int, help="SFT leg's steps (default: sft_distill.max_steps, 600)")
    parser.add_argument("--distill-steps", type=int, default=300, help="on-policy leg's iterations")
    parser.add_argument("--sft-every", type=int, help="evaluate every K SFT steps (default: about 10 points)")
    parser.add_argument("--distill-every", type=int, help="evaluate every K iterations (default: about 10 points)")
    parser.add_argument("--heldout", type=int, help="evaluate on the first N held-out problems (default: all)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, help="where the points go (default: a new temporary directory)")
    arguments, overrides = parser.parse_known_args()
    main(arguments, overrides)
