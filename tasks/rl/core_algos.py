"""RL's math on tensors (verl's ``core_algos``): KL estimators, reward shaping, advantage estimators, policy
surrogates and their aggregation, the value loss and the KL controller, each registered by name where params pick
it. No models, no I/O, no config objects; what the other stages share (token log-probs, masks, the supervised and
pairwise losses) is ``tasks/algos``, so that editing an RL loss re-runs only the stages that run RL.

Shapes: B sequences, T token positions, V vocabulary. Masks are 1.0 on tokens
that count and 0.0 on prompt and padding tokens.
"""

from collections.abc import Callable

import torch
from torch import Tensor

from tasks.algos.tokens import masked, masked_mean, masked_variance, whiten
from tasks.common.registry_type import Registry

# --- RLHF: rewards, KL, advantages, losses. Response tensors are (B, T) over generated tokens,
# right-padded; ``mask`` marks the model's tokens (a multi-turn episode's observations are 0 in it, as padding is).


# KL estimators by name (an RL stage's ``kl_loss`` param picks one, or none).
KL_ESTIMATORS: Registry[Callable[[Tensor, Tensor], Tensor]] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """log π/π_ref per sampled token: unbiased for KL(π‖π_ref) under samples from π, but can be negative."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """½ (log π/π_ref)²: low variance, biased."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """π_ref/π − 1 − log(π_ref/π): unbiased and never negative (Schulman, 2020)."""
    log_ratio = ref_logprobs - logprobs
    return torch.expm1(log_ratio) - log_ratio


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last token that ``mask`` (B, T) marks (0 when it marks none): in an episode, its final
    turn's, however many observation tokens its mask leaves out before."""
    columns = torch.arange(mask.shape[-1], device=mask.device)
    return torch.where(mask.bool(), columns, 0).amax(-1)


def shaped_rewards(scores: torch.Tensor, mask: torch.Tensor, kl_penalty: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token rewards: the sequence score at its last token, minus ``kl_penalty`` (β·log π/π_ref, (B, T))
    at every token when the KL is in the reward."""
    rewards = torch.zeros_like(mask, dtype=scores.dtype) if kl_penalty is None else -kl_penalty * mask
    rows = torch.arange(len(scores), device=scores.device)
    rewards[rows, last_token_index(mask)] += scores
    return rewards


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016); returns (advantages, returns).

    δ_t = r_t + γ V_{t+1} − V_t with V = 0 past the last real token, A_t = Σ_l (γλ)^l δ_{t+l}.
    The recursion runs over time (it is sequential) but every row at once. t + 1 is the next token the mask marks:
    an episode's observation tokens are the environment's move, not steps of the policy, and their values never
    enter the recursion.
    """
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantages[:, t] = (delta + gamma * lam * next_advantage) * mask[:, t]
        model_token = mask[:, t].bool()
        next_value = torch.where(model_token, values[:, t], next_value)
        next_advantage = torch.where(model_token, advantages[:, t], next_advantage)
    return advantages, (advantages + values) * mask


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float
) -> torch.Tensor:
    """½ max((V − R)², (V_clip − R)²), V_clip keeping V within ``clip`` of the rollout's values."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * masked_mean(torch.maximum((values - returns) ** 2, (clipped - returns) ** 2), mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 − Var[R − V] / Var[R] over real tokens: 1 for a perfect critic, ≤ 0 for one no better than a constant."""
    return 1 - masked_variance(returns - values, mask) / masked_variance(returns, mask).clamp(min=1e-8)


def adaptive_kl_coef(coef: float, kl: float, target: float, horizon: int, num_responses: int) -> float:
    """Proportional controller of the KL coefficient (Ziegler et al., 2019): β grows when KL is above target.

    The relative error is clipped to ±0.2 so one noisy batch cannot swing β.
    """
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * num_responses / horizon)


# --- Advantage estimators, registered by name (an RL stage's ``advantage`` param picks one).
# All take the same inputs: per-token rewards (B, T) holding each response's score at its last
# token (plus any per-token KL penalty), the response mask, the group size (the G responses of
# one prompt are consecutive rows), and for estimators with a critic its values and γ, λ.
# They return per-token advantages (B, T), zero on padding, and the critic's regression
# targets (None without a critic). Group statistics are reshapes to (B / G, G), never loops.

GROUP_STD_EPS = 1e-6
# needs_critic: takes the critic's values (the trainer then runs a critic role and trains it);
# compares_group: compares the G responses of a prompt, so it needs group_size >= 2.
ADVANTAGE_ESTIMATORS: Registry[Callable[..., tuple[Tensor, Tensor | None]]] = Registry(
    "advantage estimator", needs_critic=False, compares_group=False
)


def sequence_rewards(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each response's total reward: (B, T) -> (B,)."""
    return (token_rewards * mask).sum(-1)


def _per_token(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A response's advantage on every one of its tokens: (B,) -> (B, T)."""
    return advantages[:, None] * mask


def _groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    if scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} responses do not split into groups of {group_size}")
    return scores.view(-1, group_size)


def _centred(groups: torch.Tensor) -> torch.Tensor:
    """r − group mean, exactly 0 in a group of equal rewards (float round-off would leave ±1e-16 there)."""
    return torch.where(
        groups.amax(1, keepdim=True) > groups.amin(1, keepdim=True), groups - groups.mean(1, keepdim=True), 0
    )


@ADVANTAGE_ESTIMATORS.register("grpo", compares_group=True)
def grpo_advantages(token_rewards, mask, group_size, **_) -> tuple[torch.Tensor, None]:
    """(r − group mean) / group std (Shao et al., 2024); the population std, so a group's advantages have std 1."""
    groups = _groups(sequence_rewards(token_rewards, mask), group_size)
    normalised = _centred(groups) / (groups.std(1, unbiased=False, keepdim=True) + GROUP_STD_EPS)
    return _per_token(normalised.flatten(), mask), None


@ADVANTAGE_ESTIMATORS.register("dr_grpo", compares_group=True)
def dr_grpo_advantages(token_rewards, mask, group_size, **_) -> tuple[torch.Tensor, None]:
    """r − group mean, without the std division that favours groups of nearly equal rewards (Liu et al., 2025)."""
    groups = _groups(sequence_rewards(token_rewards, mask), group_size)
    return _per_token(_centred(groups).flatten(), mask), None


@ADVANTAGE_ESTIMATORS.register("rloo", compares_group=True)
def rloo_advantages(token_rewards, mask, group_size, **_) -> tuple[torch.Tensor, None]:
    """r_i − mean of the other G − 1 rewards of its group (Ahmadian et al., 2024), i.e. G/(G−1)·(r_i − group mean)."""
    if group_size < 2:
        raise ValueError("rloo needs at least 2 responses per prompt")
    groups = _groups(sequence_rewards(token_rewards, mask), group_size)
    return _per_token((_centred(groups) * group_size / (group_size - 1)).flatten(), mask), None


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def reinforce_pp_advantages(token_rewards, mask, group_size, gamma=1.0, **_) -> tuple[torch.Tensor, None]:
    """REINFORCE++ (Hu, 2025): each token's discounted return-to-go, whitened over the whole batch's tokens; the
    discount counts the model's tokens only (an episode's observations are not its steps)."""
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(mask[:, t].bool(), token_rewards[:, t] * mask[:, t] + gamma * running, running)
        returns[:, t] = running
    return whiten(returns * mask, mask), None


@ADVANTAGE_ESTIMATORS.register("gae", needs_critic=True)
def gae_advantages(
    token_rewards, mask, group_size, values, gamma=1.0, lam=1.0, **_
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's estimator: GAE(γ, λ) on the critic's values, whitened; the returns train the critic."""
    advantages, returns = gae(token_rewards, values, mask, gamma, lam)
    return whiten(advantages, mask), returns


def informative_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups have rewards that differ (DAPO's dynamic sampling keeps only these): (B,) -> (B / G,) bool."""
    groups = _groups(scores, group_size)
    return groups.amax(1) > groups.amin(1)


def overlong_penalty(lengths: torch.Tensor, truncated: torch.Tensor, max_length: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to max_length − buffer, then linearly down to −1 at max_length;
    −1 for a response cut off at max_length without ending."""
    soft = ((max_length - buffer) - lengths.float()).clamp(max=0) / max(buffer, 1)
    return torch.where(truncated, torch.full_like(soft, -1.0), soft.clamp(min=-1.0))


# --- Policy losses in two registered parts (verl's compute_policy_loss and agg_loss). A surrogate (an RL stage's
# ``policy_loss``) gives every response token its loss: it takes (log π_θ, log π_old, advantages, mask) over
# response tokens and the clip range, and returns per-token (losses, whether the clip binds), (B, T) each, whatever
# it likes on padding. An aggregation mode (``loss_agg_mode``) reduces those losses to the minibatch's, padding
# selected away; any surrogate goes with any mode.

POLICY_LOSSES: Registry[Callable[..., tuple[Tensor, Tensor]]] = Registry("policy loss")
# per: what a mode's loss is a mean over, "tokens" or "sequences" (the responses, or a multiple of them), which
# data-parallel workers read to weight their shares of a minibatch so that the averaged gradient is the whole's.
LOSS_AGG_MODES: Registry[Callable[..., Tensor]] = Registry("loss aggregation mode", per="tokens")


@LOSS_AGG_MODES.register("token_mean")
def token_mean(loss_mat: Tensor, mask: Tensor, **_: object) -> Tensor:
    """The mean over every token of the minibatch (DAPO's token-level loss): a long response weighs more."""
    return masked_mean(loss_mat, mask)


@LOSS_AGG_MODES.register("seq_mean_token_mean", per="sequences")
def seq_mean_token_mean(loss_mat: Tensor, mask: Tensor, **_: object) -> Tensor:
    """Each response's mean over its tokens, then the mean over responses (GRPO as published)."""
    return (masked(loss_mat, mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


@LOSS_AGG_MODES.register("seq_mean_token_sum_norm", per="sequences")
def seq_mean_token_sum_norm(loss_mat: Tensor, mask: Tensor, max_length: int, **_: object) -> Tensor:
    """The sum over every token divided by a constant, B × max_length (Dr. GRPO): no response-length
    normalisation, so long wrong answers are not penalised less per token."""
    return masked(loss_mat, mask).sum() / (mask.shape[0] * max_length)


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str, max_length: int | None = None) -> Tensor:
    """Per-token losses (B, T) reduced to a scalar by the registered aggregation ``mode`` (``max_length``: the
    longest response a rollout may have, which ``seq_mean_token_sum_norm`` divides by)."""
    return LOSS_AGG_MODES[mode](loss_mat, mask, max_length=max_length)


def _ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """ρ = π/π_old per token, formed on real tokens only (padding's garbage cannot overflow it)."""
    return torch.exp(masked(logprobs - old_logprobs, mask))


def _clipped(advantages: Tensor, ratio: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """max(−Â·ρ, −Â·clip(ρ, 1−ε_low, 1+ε_high)) and whether the clip binds (ε_high > ε_low: DAPO's clip-higher)."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_low, 1 + eps_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


@POLICY_LOSSES.register("ppo")
def ppo_surrogate(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate on each token's ratio."""
    return _clipped(advantages, _ratio(logprobs, old_logprobs, mask), eps_low, eps_high)


def sequence_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GSPO's sequence importance weight exp(mean_t log π/π_old): (B, T) -> (B,)."""
    log_ratio = masked(logprobs - old_logprobs, mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return torch.exp(log_ratio)


@POLICY_LOSSES.register("gspo")
def gspo_surrogate(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """GSPO (Zheng et al., 2025): the clipped surrogate on the length-normalised sequence ratio and the response's
    mean advantage, the same on every token of the response (``seq_mean_token_mean`` is then the paper's loss)."""
    sequence_advantages = masked(advantages, mask).sum(-1) / mask.sum(-1).clamp(min=1)
    losses, clipped = _clipped(sequence_advantages, sequence_ratio(logprobs, old_logprobs, mask), eps_low, eps_high)
    return losses[:, None].expand_as(mask), clipped[:, None].expand_as(mask)


@POLICY_LOSSES.register("cispo")
def cispo_surrogate(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """CISPO (MiniMax, 2025): −sg(clip(ρ))·Â·log π per token. The importance weight is clipped and detached,
    so every token keeps a gradient through log π, however far its ratio has moved."""
    ratio = _ratio(logprobs, old_logprobs, mask)
    weight = ratio.clamp(1 - eps_low, 1 + eps_high).detach()
    clipped = ((ratio < 1 - eps_low) | (ratio > 1 + eps_high)).float()
    return -weight * advantages * logprobs, clipped
