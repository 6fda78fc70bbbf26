"""Distillation losses: how far the student's next-token distributions are from the teacher's, registered by name.

Both models read the same tokens (the student's own samples on-policy, the teacher's responses off-policy),
at every response position t, with their logits divided by the same temperature. Each loss returns a
per-token divergence (B, T), zero on padding; ``mask`` (B, T) is 1.0 on real response tokens.

- ``reverse_kl``: log π_s(y_t) − log π_t(y_t) at the token y_t the student sampled, the single-sample
  estimate of KL(π_s ‖ π_t) at that position (its expectation under π_s is the exact reverse KL). As a loss its
  gradient would vanish in expectation, so it is a *dense advantage* instead: −(log π_s − log π_t) for every
  token, trained by the policy-gradient loss (Agarwal et al., 2024; Thinking Machines' "On-Policy
  Distillation", 2025). It needs only the teacher's log-probs of the sampled tokens.
- ``gkd``: the generalised Jensen–Shannon divergence over the full vocabulary (Agarwal et al., 2024, GKD),
  JSD(β) = β KL(π_t ‖ m) + (1 − β) KL(π_s ‖ m) with m = β π_t + (1 − β) π_s, divided by β (1 − β). Unscaled
  it falls to 0 at both ends, which is how peers end up with a zero loss or a jump at β = 0 and 1; scaled, it
  is KL(π_t ‖ m) / (1 − β) + KL(π_s ‖ m) / β, which tends to the forward KL(π_t ‖ π_s) as β → 0 and to the
  reverse KL(π_s ‖ π_t) as β → 1 (Huszár, 2015). β = 0 and β = 1 are computed as exactly those.
"""

import math
from collections.abc import Callable

import torch

from tasks.algos.tokens import masked
from tasks.common.registry_type import Registry

# full_vocabulary, which the trainer reads instead of the loss's name. True: takes both models' logits over the
# vocabulary and is minimised directly in the actor's update. False: takes the log-probs of the sampled tokens, and
# its negation is a per-token advantage.
DISTILL_LOSSES: Registry[Callable[..., torch.Tensor]] = Registry("distillation loss", full_vocabulary=False)


@DISTILL_LOSSES.register("reverse_kl", full_vocabulary=False)
def reverse_kl(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor, **_):
    """(B, T): log π_s(y_t) − log π_t(y_t) of the sampled tokens, an unbiased estimate of KL(π_s ‖ π_t) per token."""
    return masked(student_logprobs - teacher_logprobs, mask)


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """In at least float32 (half-precision logits would lose the small differences the divergence measures)."""
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)


def kl_divergence(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) over the last axis from log-probabilities: (..., V) -> (...)."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


@DISTILL_LOSSES.register("gkd", full_vocabulary=True)
def generalized_jsd(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor, beta: float = 0.5, **_
) -> torch.Tensor:
    """(B, T): JSD(β)(π_t ‖ π_s) / (β (1 − β)) at every position, from logits (B, T, V); see the module docstring.

    The mixture's log-ratios come from d = log π_t − log π_s, never as a difference of two large logs:
    log m − log π_s = log1p(β expm1(d)) and log m − log π_t = log1p((1 − β) expm1(−d)), exactly 0 where the
    models agree and accurate as β nears 0 or 1. Each KL is ≥ 0; round-off below 0 is clamped to 0."""
    student, teacher = _log_softmax(student_logits), _log_softmax(teacher_logits)
    if beta == 0:
        divergence = kl_divergence(teacher, student)
    elif beta == 1:
        divergence = kl_divergence(student, teacher)
    else:
        log_ratio = teacher - student
        mixture_over_student = _log_mixture(log_ratio, beta)
        mixture_over_teacher = _log_mixture(-log_ratio, 1 - beta)
        teacher_to_mixture = -(teacher.exp() * mixture_over_teacher).sum(-1)
        student_to_mixture = -(student.exp() * mixture_over_student).sum(-1)
        divergence = teacher_to_mixture / (1 - beta) + student_to_mixture / beta
    return masked(divergence.clamp(min=0), mask)


# Past this log-ratio the sum is far from 0 and logaddexp is accurate; expm1 would overflow float32 past 88.
_LARGE_LOG_RATIO = 30.0


def _log_mixture(log_ratio: torch.Tensor, weight: float) -> torch.Tensor:
    """log((1 − w) + w e^d) for d = ``log_ratio``: the mixture's log-ratio to the distribution d is measured from."""
    near = torch.log1p(weight * torch.expm1(log_ratio.clamp(max=_LARGE_LOG_RATIO)))
    far = torch.logaddexp(torch.full_like(log_ratio, math.log1p(-weight)), math.log(weight) + log_ratio)
    return torch.where(log_ratio < _LARGE_LOG_RATIO, near, far)
