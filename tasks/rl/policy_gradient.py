"""The policy-gradient learner (PPO, GRPO and their kin): steps 3-5 of the RL loop (``tasks/rl/trainer.py``).

On one scored rollout: the log-probs of the actor (π_old, when the update's own pass cannot give them), of the
reference (when a KL term needs it) and the critic's values (when the advantage estimator needs a critic), run
concurrently across the roles; per-token rewards (the score at the last token, and −β·log π/π_ref at every token
when the KL is in the reward) through the ``advantage`` estimator; then ``epochs`` passes of minibatches of
``policy_gradient_loss`` in the actor (each token's surrogate corrected by ``rollout_correction`` for the engine that
sampled it), while the critic regresses on its returns.
"""

import time
from functools import partial

import torch

from tasks.algos.tokens import entropy_from_logits, masked, masked_mean
from tasks.common.config import RLConfig
from tasks.rl.core_algos import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    agg_loss,
    explained_variance,
    kl_k1,
    shaped_rewards,
)
from tasks.rl.learner import (
    Learner,
    LoopState,
    Rollout,
    policy_metrics,
    prepare_scores,
    reward_roles,
    sampled_logprobs,
)
from tasks.rl.role_handles import Roles
from tasks.rl.rollout_correction import correction, mismatch_metrics, off_policy
from tasks.rl.workers import ActorLoss, Metrics, Minibatch


def needed_roles(cfg: RLConfig) -> set[str]:
    """The roles besides the actor that this configuration uses."""
    roles = set()
    if ADVANTAGE_ESTIMATORS[cfg.advantage].needs_critic:
        roles.add("critic")
    if cfg.kl_in_reward or cfg.kl_loss != "none" or cfg.ref_reset_every:
        roles.add("reference")
    return roles | reward_roles(cfg)


def policy_gradient_loss(minibatch: Minibatch, cfg: RLConfig, kl_coef: float) -> tuple[torch.Tensor, Metrics]:
    """The ``policy_loss`` surrogate on the minibatch's ``advantages``, aggregated by ``loss_agg_mode``, minus the
    entropy bonus, plus ``kl_coef`` × the ``kl_loss`` estimate of the KL to the reference (``ref_logprobs``)."""
    mask, logprobs, old_logprobs = minibatch.mask, minibatch.logprobs, minibatch.old_logprobs
    losses, clipped = POLICY_LOSSES[cfg.policy_loss](
        logprobs, old_logprobs, minibatch.inputs["advantages"], mask, eps_low=cfg.clip_low, eps_high=cfg.clip_high
    )
    engine_logprobs = minibatch.inputs.get("engine_logprobs")  # none for responses no engine sampled (a teacher's)
    settings = off_policy(cfg, len(mask))
    if engine_logprobs is not None and settings.corrected:
        losses = losses * correction(old_logprobs, engine_logprobs, mask, settings)
    policy_loss = agg_loss(losses, mask, cfg.loss_agg_mode, cfg.max_new_tokens)
    per_token = minibatch.per_token
    loss_weight = per_token if LOSS_AGG_MODES[cfg.loss_agg_mode].per == "tokens" else minibatch.per_item
    with torch.set_grad_enabled(cfg.entropy_coef != 0):  # a metric only, unless it is in the loss
        entropy = masked_mean(entropy_from_logits(minibatch.logits), mask)
    loss = loss_weight * policy_loss - per_token * cfg.entropy_coef * entropy
    kl_estimator = KL_ESTIMATORS.get(cfg.kl_loss)
    if kl_estimator is not None:
        kl = masked_mean(kl_estimator(logprobs, minibatch.inputs["ref_logprobs"]), mask)
        loss = loss + per_token * (kl_coef * kl)
    with torch.no_grad():
        # k3 estimate of KL(π_old ‖ π_θ) on the sampled tokens: how far the updates so far moved the policy
        log_ratio = masked(old_logprobs - logprobs, mask)
        approx_kl = masked_mean(torch.expm1(log_ratio) - log_ratio, mask)
    return loss, {
        "policy_loss": (policy_loss, loss_weight),
        "clip_fraction": (masked_mean(clipped, mask), per_token),
        "entropy": (entropy, per_token),
        "approx_kl": (approx_kl, per_token),
    }


def learn(
    roles: Roles, rollout: Rollout, tokenizer, cfg: RLConfig, state: LoopState, clock: dict[str, float]
) -> dict[str, float]:
    """Advantages and updates on one scored rollout; returns the iteration's training metrics."""
    started = time.perf_counter()
    batch = rollout.packed(tokenizer)
    mask = batch.response_mask
    engine_logprobs = sampled_logprobs(rollout.completions, mask)
    # Semi-online, the actor's own pass runs all the same: it measures parity and KL against the policy as it is.
    settings = off_policy(cfg, len(mask))
    source = settings.old_logprobs
    passes = (
        roles.actor.logprobs(batch) if source != "update" else None,
        roles.reference.logprobs(batch) if roles.reference else None,
        roles.critic.values(batch) if roles.critic else None,
    )
    current_logprobs, ref_logprobs, values = (p.result() if p is not None else None for p in passes)
    old_logprobs = engine_logprobs if source == "engine" else current_logprobs
    passed = time.perf_counter()
    clock["time/score"] += passed - started

    scores = prepare_scores(rollout.scores, cfg, state.moments)
    kl_penalty = state.kl_coef * kl_k1(old_logprobs, ref_logprobs) if cfg.kl_in_reward else None
    token_rewards = shaped_rewards(scores, mask, kl_penalty)
    advantages, returns = ADVANTAGE_ESTIMATORS[cfg.advantage](
        token_rewards, mask, cfg.group_size, values=values, gamma=cfg.gamma, lam=cfg.lam
    )
    loss = ActorLoss(partial(policy_gradient_loss, kl_coef=state.kl_coef))
    rows = {"advantages": advantages, "ref_logprobs": ref_logprobs, "engine_logprobs": engine_logprobs}
    actor_update = roles.actor.update(batch, loss, rows, old_logprobs)
    critic_update = roles.critic.update(batch, values, returns) if roles.critic else None
    metrics, old_logprobs = actor_update.result()
    if critic_update is not None:
        metrics |= critic_update.result()
    clock["time/train"] += time.perf_counter() - passed

    trainer_logprobs = current_logprobs if source == "engine" else old_logprobs
    engines = [c.engine for c in rollout.completions]
    metrics |= policy_metrics(engine_logprobs, trainer_logprobs, ref_logprobs, mask, engines)
    metrics |= mismatch_metrics(old_logprobs, engine_logprobs, mask, settings)
    if ref_logprobs is not None:
        metrics["kl_coef"] = state.kl_coef
    if values is not None:
        metrics["explained_variance"] = explained_variance(values, returns, mask).item()
    return metrics


POLICY_GRADIENT = Learner(needed_roles, learn)
