"""Preference losses on (chosen, rejected) pairs: pure functions on sequence log-probs, registered by name.

Every loss takes a ``PairLogprobs`` (each response's summed log-prob under the policy, and under the
reference for losses that use one, with its token count) and its knobs, and returns
``(per-pair losses (P,), chosen rewards (P,), rejected rewards (P,))``: the implicit rewards whose
difference is the pair's margin, positive when the policy ranks the chosen response higher.
With h = (log π(y_c) − log π_ref(y_c)) − (log π(y_r) − log π_ref(y_r)), the log-ratio margin:

- ``dpo``: −log σ(β h) (Rafailov et al., 2023);
- ``cdpo``: −(1−ε) log σ(β h) − ε log σ(−β h), DPO with labels flipped with probability ε
  (Mitchell, 2023; "conservative DPO"); ε = 0 is DPO, ε = 0.5 (labels at chance) is minimised at h = 0;
- ``ipo``: (h − 1/(2β))², a squared loss whose minimum is the finite margin 1/(2β) (Azar et al., 2023);
- ``hinge``: max(0, 1 − β h), SLiC's calibration loss with the reference as anchor (Zhao et al., 2023);
- ``simpo``: −log σ(β (log π(y_c)/|y_c| − log π(y_r)/|y_r|) − γ), reference-free and length-normalised,
  with a target margin γ (Meng et al., 2024);
- ``orpo``: −log p̄(y_c) + β · −log σ(log odds(y_c) − log odds(y_r)), odds(y) = p̄/(1 − p̄) with p̄ the mean
  per-token likelihood: reference-free, SFT and preference in one loss (Hong et al., 2024).

An optional SFT term on the chosen response (``sft_weight``; RPO, Pang et al., 2024) is added by
``preference_loss``. Shapes: P pairs; log-probs are float sums over real response tokens only.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn.functional import logsigmoid, relu

from tasks.common.registry_type import Registry


@dataclass(frozen=True)
class PairLogprobs:
    chosen: torch.Tensor  # (P,) Σ_t log π(y_c,t | ·)
    rejected: torch.Tensor  # (P,)
    chosen_tokens: torch.Tensor  # (P,) |y_c|, real tokens
    rejected_tokens: torch.Tensor  # (P,)
    ref_chosen: torch.Tensor | None = None  # (P,) the same sums under the reference
    ref_rejected: torch.Tensor | None = None

    def log_ratio_margin(self) -> torch.Tensor:
        """h: how much more the policy than the reference prefers the chosen response, in nats."""
        if self.ref_chosen is None or self.ref_rejected is None:
            raise ValueError("this loss needs the reference's log-probs of both responses")
        return (self.chosen - self.ref_chosen) - (self.rejected - self.ref_rejected)

    def mean_chosen(self) -> torch.Tensor:
        return self.chosen / self.chosen_tokens.clamp(min=1)

    def mean_rejected(self) -> torch.Tensor:
        return self.rejected / self.rejected_tokens.clamp(min=1)


def sequence_logprobs(token_logprobs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ_t log p over real tokens, the number of real tokens): (B, T) -> (B,), (B,). Padding is selected away,
    so whatever it holds (even inf or nan) contributes nothing."""
    return torch.where(mask.bool(), token_logprobs, 0).sum(-1), mask.sum(-1)


Losses = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
# needs_reference: reads the reference's log-probs (the dpo stage then needs dpo_reference), which the stages read
# instead of the loss's name.
PREFERENCE_LOSSES: Registry[Callable[..., Losses]] = Registry("preference loss", needs_reference=True)


def _ratio_rewards(pairs: PairLogprobs, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DPO's implicit rewards β log π(y)/π_ref(y) of the chosen and the rejected response."""
    return beta * (pairs.chosen - pairs.ref_chosen).detach(), beta * (pairs.rejected - pairs.ref_rejected).detach()


@PREFERENCE_LOSSES.register("dpo")
def dpo_loss(pairs: PairLogprobs, beta: float, **_) -> Losses:
    """−log σ(β h) (Rafailov et al., 2023)."""
    return -logsigmoid(beta * pairs.log_ratio_margin()), *_ratio_rewards(pairs, beta)


@PREFERENCE_LOSSES.register("cdpo")
def cdpo_loss(pairs: PairLogprobs, beta: float, label_smoothing: float, **_) -> Losses:
    """−(1−ε) log σ(β h) − ε log σ(−β h): DPO for labels that are wrong with probability ε."""
    logits = beta * pairs.log_ratio_margin()
    losses = -(1 - label_smoothing) * logsigmoid(logits) - label_smoothing * logsigmoid(-logits)
    return losses, *_ratio_rewards(pairs, beta)


@PREFERENCE_LOSSES.register("ipo")
def ipo_loss(pairs: PairLogprobs, beta: float, **_) -> Losses:
    """(h − 1/(2β))² (Azar et al., 2023): the margin is pulled to a finite target, not pushed without end."""
    return (pairs.log_ratio_margin() - 1 / (2 * beta)) ** 2, *_ratio_rewards(pairs, beta)


@PREFERENCE_LOSSES.register("hinge")
def hinge_loss(pairs: PairLogprobs, beta: float, **_) -> Losses:
    """max(0, 1 − β h) (SLiC, Zhao et al., 2023)."""
    return relu(1 - beta * pairs.log_ratio_margin()), *_ratio_rewards(pairs, beta)


@PREFERENCE_LOSSES.register("simpo", needs_reference=False)
def simpo_loss(pairs: PairLogprobs, beta: float, simpo_gamma: float, **_) -> Losses:
    """−log σ(β (mean log π(y_c) − mean log π(y_r)) − γ) (Meng et al., 2024): no reference."""
    chosen, rejected = beta * pairs.mean_chosen(), beta * pairs.mean_rejected()
    return -logsigmoid(chosen - rejected - simpo_gamma), chosen.detach(), rejected.detach()


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − eˣ) for x < 0, accurate over the whole range (Mächler, 2012): near 0, 1 − eˣ = −expm1(x) keeps
    the digits that 1 − exp(x) cancels away (log1p(−exp(x)) at x = −2e-6 is 1e-2 off in float32); far below,
    log1p(−eˣ) keeps those that expm1 rounds to −1."""
    return torch.where(x > -math.log(2), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def _log_odds(mean_logprob: torch.Tensor) -> torch.Tensor:
    """log(p / (1 − p)) from log p < 0 (clamped below 0, where the odds of a certain response are infinite)."""
    mean_logprob = mean_logprob.clamp(max=-1e-6)
    return mean_logprob - log1mexp(mean_logprob)


@PREFERENCE_LOSSES.register("orpo", needs_reference=False)
def orpo_loss(pairs: PairLogprobs, beta: float, **_) -> Losses:
    """−mean log π(y_c) − β log σ(log odds(y_c) − log odds(y_r)) (Hong et al., 2024): no reference, no SFT stage."""
    chosen, rejected = _log_odds(pairs.mean_chosen()), _log_odds(pairs.mean_rejected())
    losses = -pairs.mean_chosen() - beta * logsigmoid(chosen - rejected)
    return losses, chosen.detach(), rejected.detach()


def preference_loss(
    name: str,
    pairs: PairLogprobs,
    beta: float,
    label_smoothing: float = 0.0,
    simpo_gamma: float = 0.0,
    sft_weight: float = 0.0,
) -> Losses:
    """The registered loss ``name``, plus ``sft_weight`` × the chosen response's mean token NLL (RPO)."""
    losses, chosen, rejected = PREFERENCE_LOSSES[name](
        pairs, beta=beta, label_smoothing=label_smoothing, simpo_gamma=simpo_gamma
    )
    if sft_weight:
        losses = losses - sft_weight * pairs.mean_chosen()
    return losses, chosen, rejected


def best_and_worst(scores: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Online pairs from groups of ``group_size`` scored responses: the row of each group's best and worst
    response (the first of equals), for groups whose scores differ; a group of ties makes no pair. (B,) ->
    (P,), (P,) row indices."""
    groups = scores.view(-1, group_size)
    differ = (groups.amax(1) > groups.amin(1)).nonzero().squeeze(-1)
    offsets = differ * group_size
    return offsets + groups[differ].argmax(1), offsets + groups[differ].argmin(1)
