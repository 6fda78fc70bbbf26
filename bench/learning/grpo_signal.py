"""GRPO's learning signal against the noise of its updates, side by side from one cold start.

Three legs run the RL trainer's own ``collect`` and ``learn`` (``tasks/rl/trainer.py``,
``tasks/rl/policy_gradient.py``) with ``params.grpo``, from the same cold-start model, on the same prompts; only
the advantages differ:

  grpo      the configured estimator's advantages, as the ``grpo`` stage computes them;
  noise     random ±1 per response, the same scale: what the updates' noise alone does to the model;
  positive  the configured advantages with the negative ones set to 0 (online rejection-sampling fine-tuning);
  supervised  every response replaced by its problem's worked solution, advantage 1: supervised fine-tuning on
            correct data through the same update, at the same learning rate. Where it falls too, the updates'
            size, not the reward's signal, is what the cold start cannot take.

Greedy pass@1 on the held-out split is printed every ``--every`` iterations. ``grpo`` minus ``noise`` is
what the reward teaches; the fall of ``noise`` is what the optimizer's noise costs at this learning rate.
A scratch clone of this repo builds data, base and sft_cold first (params overrides apply to every stage).

    .venv/bin/python -m bench.learning.grpo_signal [--iterations N] [--every K] [KEY=VALUE ...]  # grpo.actor_lr=1e-5
"""

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from bench.harness import cold_start_project
from models import load_tokenizer
from tasks.common.config import Params
from tasks.common.training import make_deterministic
from tasks.data.datasets import read_examples
from tasks.data.problems import Example
from tasks.data.prompts import finished_response_ids
from tasks.params.load import load_params
from tasks.rl import trainer as rl
from tasks.rl.core_algos import ADVANTAGE_ESTIMATORS
from tasks.rl.learner import LoopState, Rollout
from tasks.rl.placement import place
from tasks.rl.policy_gradient import learn, needed_roles
from tasks.rl.rewards import RewardScorer
from tasks.rl.role_handles import ActorHandle
from tasks.rollout.engine import Completion
from tasks.stages.eval import greedy_responses


def register_bench_estimators(configured: str) -> None:
    """The ``noise`` and ``positive`` legs' advantages, registered beside the real estimators for this process."""
    signs = torch.Generator().manual_seed(0)  # its own stream: the legs' sampling RNG stays in step

    @ADVANTAGE_ESTIMATORS.register("noise")
    def noise(token_rewards, mask, group_size, **_):
        return (torch.randint(0, 2, (len(mask),), generator=signs).float() * 2 - 1)[:, None] * mask, None

    @ADVANTAGE_ESTIMATORS.register("positive")
    def positive(token_rewards, mask, group_size, **kwargs):
        advantages, _ = ADVANTAGE_ESTIMATORS[configured](token_rewards, mask, group_size, **kwargs)
        return advantages.clamp(min=0), None

    @ADVANTAGE_ESTIMATORS.register("supervised")
    def supervised(token_rewards, mask, group_size, **_):
        return mask.clone(), None


def as_worked_solutions(rollout: Rollout, tokenizer) -> Rollout:
    """``rollout`` with every response replaced by its problem's worked solution (ending with end-of-sequence)."""
    completions = []
    for example, completion in zip(rollout.examples, rollout.completions, strict=True):
        ids = finished_response_ids(tokenizer, example.solution)
        completions.append(
            Completion(completion.prompt_index, completion.prompt_ids, ids, example.solution, [0.0] * len(ids))
        )
    return replace(rollout, completions=completions)


def unchanged(rollout: Rollout, tokenizer) -> Rollout:
    return rollout


# leg -> (its advantage estimator, None for the configured one; what the leg trains on instead of the rollout)
LEGS = {
    "grpo": (None, unchanged),
    "noise": ("noise", unchanged),
    "positive": ("positive", unchanged),
    "supervised": ("supervised", as_worked_solutions),
}


def greedy_pass_at_1(actor: ActorHandle, test: list[Example], max_new_tokens: int) -> float:
    return greedy_responses(actor.local.engine, test, max_new_tokens)[1][:, 1].float().mean().item()


def leg(project: Path, params: Params, name: str, iterations: int, every: int) -> list[float]:
    """Greedy pass@1 at iteration 0, every, 2·every, ... of leg ``name``'s RL from sft_cold."""
    make_deterministic(params.seed)
    advantage, train_on = LEGS[name]
    cfg = replace(params.grpo, advantage=advantage or params.grpo.advantage)
    init = project / "artifacts/sft_cold"
    examples = read_examples(project / "artifacts/data/train.jsonl")
    test = read_examples(project / "artifacts/data/test.jsonl")
    roles, tokenizer = place(params, cfg, init, [], needed_roles(cfg)), load_tokenizer(init)
    state = LoopState(kl_coef=cfg.kl_coef)
    curve = [greedy_pass_at_1(roles.actor, test, cfg.max_new_tokens)]
    with RewardScorer(cfg.rewards, cfg.reward_timeout_seconds) as scorer:
        for iteration in tqdm(range(1, iterations + 1), desc=name):
            clock = dict.fromkeys(("time/generate", "time/score", "time/train"), 0.0)
            rollout, _ = rl.collect(roles, scorer, examples, cfg, state, params.seed, clock)
            if rollout is not None:
                learn(roles, train_on(rollout, tokenizer), tokenizer, cfg, state, clock)
            if iteration % every == 0:
                curve.append(greedy_pass_at_1(roles.actor, test, cfg.max_new_tokens))
    return curve


def main(iterations: int, every: int, overrides: list[str]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        project = cold_start_project(Path(scratch) / "project", overrides)
        params = load_params(project / "params.yaml", overrides)
        register_bench_estimators(params.grpo.advantage)
        curves = {name: leg(project, params, name, iterations, every) for name in LEGS}

    cfg = params.grpo
    print(
        f"\nheld-out greedy pass@1 from sft_cold: {cfg.rollout_batch_size} prompts x {cfg.group_size} per iteration, "
        f"{cfg.advantage} advantages, {cfg.policy_loss} loss, actor_lr {cfg.actor_lr}"
        + (f" ({' '.join(overrides)})" if overrides else "")
    )
    print("iteration " + "".join(f"{name:>11}" for name in LEGS))
    for row, values in enumerate(zip(*curves.values(), strict=True)):
        print(f"{row * every:>9} " + "".join(f"{value:>11.3f}" for value in values))
    start, final = curves["grpo"][0], {name: curve[-1] for name, curve in curves.items()}
    print(
        f"after {iterations} iterations: grpo {final['grpo'] - start:+.3f}, noise {final['noise'] - start:+.3f}, "
        f"positive {final['positive'] - start:+.3f}, supervised {final['supervised'] - start:+.3f}; "
        f"what the reward teaches (grpo - noise): "
        f"{final['grpo'] - final['noise']:+.3f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--every", type=int, default=10)
    arguments, overrides = parser.parse_known_args()
    main(arguments.iterations, arguments.every, overrides)
