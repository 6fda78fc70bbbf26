"""On-policy distillation: a ``Learner`` for the RL trainer's loop, with the teacher a frozen role.

Each iteration the student (the actor) samples ``group_size`` responses to each of ``rollout_batch_size``
prompts through its rollout engine, and the teacher reads every token the student sampled:

- a sampled-token loss (``reverse_kl``): log π_t − log π_s at each sampled token, with π_s the policy that
  sampled it, is a dense per-token advantage, trained by the policy loss (``policy_loss``) as any advantage is;
- a full-vocabulary loss (``gkd``): the teacher's logits at every response position, and the actor minimises
  the divergence to them in its update, beside the policy loss (``distillation_loss``).

``reward_coef`` > 0 adds the verifier's scalar reward (``rewards`` through the ``advantage`` estimator) to those
advantages: the dense distillation signal plus a task reward. With ``lmbda`` < 1 a fraction 1 − λ of the
iterations, spread evenly, train on the teacher's own verified responses (``teacher_data``) instead of
samples (GKD's mixture; a full-vocabulary loss only, since a sampled-token estimate needs the student's samples).
"""

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from tasks.algos.tokens import masked_mean
from tasks.common.config import DistillConfig
from tasks.common.training import epoch_batch
from tasks.data.datasets import DatasetError, read_examples
from tasks.data.problems import Example
from tasks.data.prompts import PromptFormat
from tasks.rl.core_algos import ADVANTAGE_ESTIMATORS, shaped_rewards
from tasks.rl.distill_losses import DISTILL_LOSSES
from tasks.rl.learner import (
    Learner,
    LoopState,
    Rollout,
    policy_metrics,
    prepare_scores,
    sampled_logprobs,
)
from tasks.rl.policy_gradient import policy_gradient_loss
from tasks.rl.role_handles import Roles
from tasks.rl.rollout_correction import mismatch_metrics, off_policy
from tasks.rl.workers import ActorLoss, Metrics, Minibatch
from tasks.rollout.engine import Completion


def distill_roles(cfg: DistillConfig) -> set[str]:
    return {"teacher"} | ({"reference"} if cfg.kl_loss != "none" else set())


def distillation_loss(minibatch: Minibatch, cfg: DistillConfig, kl_coef: float) -> tuple[torch.Tensor, Metrics]:
    """The policy-gradient loss plus the full-vocabulary divergence ``distill_loss`` to the teacher's logits
    (``teacher_logits`` (B, T, V), over the teacher's vocabulary: a checkpoint may pad the student's)."""
    loss, metrics = policy_gradient_loss(minibatch, cfg, kl_coef)
    teacher = minibatch.inputs["teacher_logits"]
    student = minibatch.logits[..., : teacher.shape[-1]]
    mask = minibatch.mask
    divergence = masked_mean(DISTILL_LOSSES[cfg.distill_loss](student, teacher, mask, beta=cfg.jsd_beta), mask)
    return loss + minibatch.per_token * divergence, metrics | {"divergence": (divergence, minibatch.per_token)}


def learn_distillation(
    roles: Roles, rollout: Rollout, tokenizer, cfg: DistillConfig, state: LoopState, clock: dict[str, float]
) -> dict[str, float]:
    """The teacher's grades of every token of one rollout, then the student's update on them; returns the
    iteration's training metrics."""
    loss = DISTILL_LOSSES[cfg.distill_loss]
    started = time.perf_counter()
    batch = rollout.packed(tokenizer)
    mask = batch.response_mask
    teacher_call = roles.teacher.logits(batch) if loss.full_vocabulary else roles.teacher.logprobs(batch)
    reference_call = roles.reference.logprobs(batch) if roles.reference else None
    sampled = sampled_logprobs(rollout.completions, mask) if rollout.on_policy else None
    settings = off_policy(cfg, len(mask), rollout.on_policy)
    source = settings.old_logprobs
    old_logprobs = sampled if source == "engine" else None
    if source == "actor":
        old_logprobs = roles.actor.logprobs(batch).result()

    advantages = torch.zeros_like(mask)
    if cfg.reward_coef and rollout.on_policy:
        token_rewards = shaped_rewards(prepare_scores(rollout.scores, cfg, state.moments), mask)
        advantages = cfg.reward_coef * ADVANTAGE_ESTIMATORS[cfg.advantage](token_rewards, mask, cfg.group_size)[0]
    teacher = teacher_call.result()
    ref_logprobs = reference_call.result() if reference_call is not None else None
    metrics = {}
    if not loss.full_vocabulary:
        # the estimate is unbiased under the policy that sampled the tokens: its log-probs, not the trainer's
        divergence = loss(sampled, teacher, mask)
        advantages = advantages - divergence
        metrics["divergence"] = (divergence.sum() / mask.sum().clamp(min=1)).item()
    passed = time.perf_counter()
    clock["time/score"] += passed - started
    compute = distillation_loss if loss.full_vocabulary else policy_gradient_loss
    teacher_logits = teacher if loss.full_vocabulary else None
    rows = {"advantages": advantages, "ref_logprobs": ref_logprobs, "teacher_logits": teacher_logits}
    rows["engine_logprobs"] = sampled  # the rollout correction's μ; None on the teacher's responses
    call = roles.actor.update(batch, ActorLoss(partial(compute, kl_coef=state.kl_coef)), rows, old_logprobs)
    update, old = call.result()
    clock["time/train"] += time.perf_counter() - passed
    metrics |= update
    if rollout.on_policy:
        metrics |= policy_metrics(sampled, old, ref_logprobs, mask, [c.engine for c in rollout.completions])
        metrics |= mismatch_metrics(old, sampled, mask, settings)
    return metrics


def teacher_batches(
    examples: list[Example], tokenizer, prompt_format: PromptFormat, cfg: DistillConfig, seed: int
) -> Callable[[int], Rollout | None]:
    """Iteration i's rollout from the teacher's verified ``examples`` on the iterations GKD's λ leaves to them
    (1 − λ of them, spread evenly: i is a student iteration when ⌊(i + 1) λ⌋ > ⌊i λ⌋), else None (sample)."""
    size = cfg.rollout_batch_size * cfg.group_size

    def draw(iteration: int) -> Rollout | None:
        if int((iteration + 1) * cfg.lmbda) > int(iteration * cfg.lmbda):
            return None
        chosen = [examples[i] for i in epoch_batch(len(examples), size, iteration, seed)]
        prompts = prompt_format.encode(tokenizer, [e.prompt for e in chosen])
        completions = [
            Completion(row, prompt, prompt_format.response_ids(tokenizer, e.solution), e.solution, [])
            for row, (e, prompt) in enumerate(zip(chosen, prompts, strict=True))
        ]
        return Rollout(chosen, completions, torch.zeros(len(chosen)), {}, {}, on_policy=False)

    return draw


def distillation_learner(
    cfg: DistillConfig, teacher_data: Path, tokenizer, prompt_format: PromptFormat, seed: int
) -> Learner:
    """The distillation learner; below λ = 1 it reads the teacher's verified responses from ``teacher_data``."""
    if cfg.lmbda == 1:
        return Learner(distill_roles, learn_distillation)
    examples = read_examples(teacher_data)
    batch = cfg.rollout_batch_size * cfg.group_size
    if len(examples) < batch:
        raise DatasetError(
            f"{teacher_data}: {len(examples)} rows, fewer than a batch of distill.rollout_batch_size x "
            f"distill.group_size = {batch}, which distill.lmbda < 1 takes from it"
        )
    draw = teacher_batches(examples, tokenizer, prompt_format, cfg, seed)
    return Learner(distill_roles, learn_distillation, draw, (teacher_data,))
