"""The online preference update (online and semi-online DPO): a ``Learner`` for the RL trainer's loop.

Each iteration's rollout holds ``group_size`` scored responses per prompt; the best and the worst of each
group become a pair (a group of equal scores makes none: dynamic sampling refills the batch with groups
that differ), the reference scores both, and the actor takes the registered preference loss on them
(``preference_minibatch_loss``; a minibatch of ``minibatch_size`` responses is half as many pairs). The reference
is the policy the stage started from, held fixed as in iterative DPO. The engine samples from a policy refreshed
every ``sync_every`` updates.
"""

import time

import torch

from tasks.algos.tokens import entropy_from_logits, masked_mean
from tasks.common.config import OnlineDPOConfig
from tasks.rl.learner import Learner, LoopState, Rollout, policy_metrics, reward_roles, sampled_logprobs
from tasks.rl.preference_losses import (
    PREFERENCE_LOSSES,
    PairLogprobs,
    best_and_worst,
    preference_loss,
    sequence_logprobs,
)
from tasks.rl.role_handles import Roles
from tasks.rl.workers import ActorLoss, Metrics, Minibatch


def preference_roles(cfg: OnlineDPOConfig) -> set[str]:
    return ({"reference"} if PREFERENCE_LOSSES[cfg.preference_loss].needs_reference else set()) | reward_roles(cfg)


def preference_minibatch_loss(minibatch: Minibatch, cfg: OnlineDPOConfig) -> tuple[torch.Tensor, Metrics]:
    """The registered ``preference_loss`` averaged over the minibatch's pairs (rows 0..P'-1 chosen, P'..2P'-1
    rejected), with the reference's log-probs (``ref_logprobs``) when the loss reads them."""
    mask = minibatch.mask
    sums, lengths = sequence_logprobs(minibatch.logprobs, mask)
    reference = (None, None)
    if "ref_logprobs" in minibatch.inputs:
        reference = sequence_logprobs(minibatch.inputs["ref_logprobs"], mask)[0].chunk(2)
    pairs = PairLogprobs(*sums.chunk(2), *lengths.chunk(2), *reference)
    losses, chosen, rejected = preference_loss(
        cfg.preference_loss, pairs, cfg.beta, cfg.label_smoothing, cfg.simpo_gamma, cfg.sft_weight
    )
    with torch.no_grad():
        entropy = masked_mean(entropy_from_logits(minibatch.logits), mask)
    values = {
        "preference_loss": losses.mean(),
        "pair_accuracy": (chosen > rejected).float().mean(),
        "margin": (chosen - rejected).mean(),
        "chosen_logp": pairs.chosen.mean(),
        "rejected_logp": pairs.rejected.mean(),
        "entropy": entropy,
    }
    weight = minibatch.per_item  # a loss averaged over pairs
    return weight * losses.mean(), {name: (value, weight) for name, value in values.items()}


# A pair is two rows of the batch, its chosen response at row i of 2P and its rejected one at row i + P; the
# update reports each row's log-probs before its first step on it, which this loss does not read as π_old.
PAIRS = ActorLoss(preference_minibatch_loss, rows_per_item=2, reads_old_logprobs=False)


def learn_preferences(
    roles: Roles, rollout: Rollout, tokenizer, cfg: OnlineDPOConfig, state: LoopState, clock: dict[str, float]
) -> dict[str, float]:
    started = time.perf_counter()
    chosen, rejected = best_and_worst(rollout.scores, cfg.group_size)
    if len(chosen) == 0:
        return {"pairs": 0.0}
    rows = [*chosen.tolist(), *rejected.tolist()]
    completions = [rollout.completions[row] for row in rows]
    batch = rollout.packed(tokenizer, rows)
    ref_logprobs = roles.reference.logprobs(batch).result() if roles.reference else None
    passed = time.perf_counter()
    clock["time/score"] += passed - started
    metrics, logprobs = roles.actor.update(batch, PAIRS, {"ref_logprobs": ref_logprobs}).result()
    clock["time/train"] += time.perf_counter() - passed
    mask = batch.response_mask
    return {
        "pairs": float(len(chosen)),
        **metrics,
        **policy_metrics(
            sampled_logprobs(completions, mask), logprobs, ref_logprobs, mask, [c.engine for c in completions]
        ),
    }


ONLINE_PREFERENCE = Learner(preference_roles, learn_preferences)
