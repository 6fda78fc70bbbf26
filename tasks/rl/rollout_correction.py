"""Off-policy correction for the gap between the engine that sampled a rollout and the trainer that scores it.

The engine samples from μ, which is not quite the trainer's π_old even with the same weights: vLLM's kernels, a
bfloat16 engine beside a trainer with fp32 master weights, other batch shapes. The clipped surrogate assumes the
samples came from π_old; left alone, tokens the trainer finds far less likely than the engine did get large,
biased updates, and training can collapse (Yao et al., 2025, "Your efficient RL framework secretly brings you
off-policy RL training"). Two registered parts, each picked by an RL stage's ``rollout_correction`` params, both on
the per-token ratio π_old/μ and both detached (they reweight the surrogate, they are not trained through):

- ``IS_WEIGHTS`` (``rollout_correction.weights``): truncated importance sampling, min(ratio, C) (TIS), per token or
  for the whole response (the product of its tokens' ratios, the same weight on each of them);
- ``REJECTIONS`` (``rollout_correction.rejection``): which tokens keep their loss. Ratios outside [1/C, C] drop the
  token (IcePop's masking), the whole response (its product: sequence-level MIS) or the whole response by the
  geometric mean of its ratios (length-independent). A dropped token's loss is multiplied by 0 rather than taken
  out of the mean, so each data-parallel rank's share of the minibatch's mean stays what it was.

``off_policy`` is the one place that decides, from an RL stage's params, where a rollout's π_old log-probs come
from and which of these parts apply: every learner and the policy loss ask it.

Shapes: (B, T) over response tokens; ``mask`` is 1.0 on the tokens that count.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from tasks.algos.tokens import masked, masked_mean
from tasks.common.config import RLConfig
from tasks.common.registry_type import Registry
from tasks.rl.core_algos import kl_k3

IS_WEIGHTS: Registry[Callable[[Tensor, Tensor, float], Tensor]] = Registry("importance weight")
REJECTIONS: Registry[Callable[[Tensor, Tensor, float], Tensor]] = Registry("rejection rule")


def _sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """Σ_t log(π_old/μ) over each response's tokens: (B, T) -> (B, 1)."""
    return masked(log_ratio, mask).sum(-1, keepdim=True)


@IS_WEIGHTS.register("token")
def token_weights(log_ratio: Tensor, mask: Tensor, cap: float) -> Tensor:
    """min(π_old/μ, C) per token (token-level TIS)."""
    return torch.exp(masked(log_ratio, mask).clamp(max=math.log(cap)))


@IS_WEIGHTS.register("sequence")
def sequence_weights(log_ratio: Tensor, mask: Tensor, cap: float) -> Tensor:
    """min(Π_t π_old/μ, C) for the whole response, on each of its tokens (sequence-level TIS); formed in log space,
    so a long response's product cannot overflow."""
    capped = _sequence_log_ratio(log_ratio, mask).clamp(max=math.log(cap))
    return torch.exp(capped).expand_as(log_ratio)


def _within(log_ratio: Tensor, bound: float) -> Tensor:
    return log_ratio.abs() <= math.log(bound)


@REJECTIONS.register("token")
def token_rejection(log_ratio: Tensor, mask: Tensor, bound: float) -> Tensor:
    """Keep a token whose ratio is within [1/C, C] (IcePop)."""
    return _within(masked(log_ratio, mask), bound)


@REJECTIONS.register("sequence")
def sequence_rejection(log_ratio: Tensor, mask: Tensor, bound: float) -> Tensor:
    """Keep a response whose product of ratios is within [1/C, C] (sequence-level MIS)."""
    return _within(_sequence_log_ratio(log_ratio, mask), bound).expand_as(log_ratio)


@REJECTIONS.register("geometric")
def geometric_rejection(log_ratio: Tensor, mask: Tensor, bound: float) -> Tensor:
    """Keep a response whose geometric-mean ratio, exp(mean_t log(π_old/μ)), is within [1/C, C]: a bound on the
    per-token mismatch that a long response does not reach by length alone."""
    mean = _sequence_log_ratio(log_ratio, mask) / mask.sum(-1, keepdim=True).clamp(min=1)
    return _within(mean, bound).expand_as(log_ratio)


def importance_weights(cfg: RLConfig) -> str:
    """The ``IS_WEIGHTS`` entry a stage uses, or "none": ``auto`` weighs tokens where the engine can differ from the
    trainer (vLLM, an engine in the training precision's bfloat16 beside fp32 master weights, or asynchronous
    rollouts, sampled by an older policy), and leaves a synchronous fp32 HF engine, which samples with the
    trainer's own weights and kernels, uncorrected."""
    chosen = cfg.rollout_correction.weights
    if chosen != "auto":
        return chosen
    differs = cfg.rollout_backend == "vllm" or cfg.precision != "fp32" or cfg.max_staleness > 0
    return "token" if differs else "none"


@dataclass(frozen=True)
class OffPolicy:
    """How a learner treats a rollout that μ sampled: where π_old's log-probs come from, and how the surrogate is
    corrected for the gap. Decided here alone, from an RL stage's params (``off_policy``)."""

    # "engine": a semi-online engine (``sync_every`` > 1) sampled the responses with older weights than the actor's:
    # that policy is π_old, and its log-probs are the ones the engine reported; "update": the actor takes a single
    # step on the rollout and nothing reads π_old before it (the KL in the reward does, before the advantages):
    # π_old is the actor as it is, whose log-probs the step's own forward pass gives (``ActorWorker.update``
    # without them); "actor": otherwise, a pass of the actor before the update.
    old_logprobs: Literal["engine", "update", "actor"]
    weights: str  # an IS_WEIGHTS entry, or "none"
    weight_cap: float
    rejection: str  # a REJECTIONS entry, or "none"
    rejection_bound: float

    @property
    def corrected(self) -> bool:
        return self.weights != "none" or self.rejection != "none"


def off_policy(cfg: RLConfig, rows: int, on_policy: bool = True) -> OffPolicy:
    """The off-policy settings of a rollout of ``rows`` responses (``on_policy``: sampled by the policy's engine,
    not taken from a dataset)."""
    updates = cfg.epochs * math.ceil(rows / cfg.minibatch_size)  # the actor's optimizer steps: one per minibatch
    if on_policy and cfg.sync_every > 1:
        source = "engine"
    elif updates == 1 and not cfg.kl_in_reward:
        source = "update"
    else:
        source = "actor"
    settings = cfg.rollout_correction
    return OffPolicy(source, importance_weights(cfg), settings.weight_cap, settings.rejection, settings.rejection_bound)


def _corrected_parts(log_ratio: Tensor, mask: Tensor, settings: OffPolicy) -> tuple[Tensor | None, Tensor | None]:
    """The importance weights and which tokens the rejection rule keeps (None for a part that is off)."""
    weights, rejection = settings.weights, settings.rejection
    weight = None if weights == "none" else IS_WEIGHTS[weights](log_ratio, mask, settings.weight_cap)
    kept = None if rejection == "none" else REJECTIONS[rejection](log_ratio, mask, settings.rejection_bound)
    return weight, kept


def correction(old_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor, settings: OffPolicy) -> Tensor:
    """(B, T) the detached factor each token's surrogate loss is multiplied by: its importance weight, 0 where the
    rejection rule drops it (1 everywhere with both off)."""
    log_ratio = (old_logprobs - engine_logprobs).detach()
    weight, kept = _corrected_parts(log_ratio, mask, settings)
    factor = torch.ones_like(log_ratio) if weight is None else weight
    return factor if kept is None else factor * kept


def mismatch_metrics(
    old_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor, settings: OffPolicy
) -> dict[str, float]:
    """What the rollout's engine-trainer gap was and what the correction made of it, logged every iteration:
    ``mismatch_kl`` (k3 estimate of KL(μ ‖ π_old) per token, on μ's samples), ``is_weight`` (the mean weight),
    ``is_truncated_fraction`` (tokens whose ratio the cap cut), ``rejected_fraction`` (tokens dropped)."""
    log_ratio = masked(old_logprobs - engine_logprobs, mask)
    metrics = {"mismatch_kl": masked_mean(kl_k3(engine_logprobs, old_logprobs), mask).item()}
    weight, kept = _corrected_parts(log_ratio, mask, settings)
    if weight is not None:
        uncapped = IS_WEIGHTS[settings.weights](log_ratio, mask, float("inf"))
        metrics["is_weight"] = masked_mean(weight, mask).item()
        metrics["is_truncated_fraction"] = masked_mean((uncapped > weight).float(), mask).item()
    if kept is not None:
        metrics["rejected_fraction"] = masked_mean((~kept).float(), mask).item()
    return metrics
