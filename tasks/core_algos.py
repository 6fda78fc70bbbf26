"""Pure algorithm math on tensors: no models, no I/O, no config objects.

Shapes: B sequences, T token positions, V vocabulary. Masks are 1.0 on tokens
that count and 0.0 on prompt and padding tokens.
"""

import torch


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens[:, t]) under logits[:, t]: (B, T, V), (B, T) -> (B, T)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1 (0 when the mask is empty).

    Padding is selected away, not multiplied by zero, so inf or nan there cannot leak in.
    """
    return torch.where(mask.bool(), values, 0).sum() / mask.sum().clamp(min=1)


def sft_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Next-token negative log-likelihood averaged over the tokens ``loss_mask`` marks (the response).

    logits (B, T, V) predict input_ids shifted by one; loss_mask (B, T) marks target tokens.
    """
    logprobs = token_logprobs(logits[:, :-1], input_ids[:, 1:])
    return -masked_mean(logprobs, loss_mask[:, 1:])


def pass_at_k(num_samples: int, num_correct: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased pass@k per problem from n samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    n, c = float(num_samples), num_correct.double()
    # C(n-c, k)/C(n, k) = prod_{i=0}^{k-1} (n-c-i)/(n-i); a factor hits zero once c > n-k.
    i = torch.arange(k, dtype=torch.float64)
    ratio = ((n - c.unsqueeze(-1) - i).clamp(min=0) / (n - i)).prod(-1)
    return 1.0 - ratio


# --- RLHF: rewards, KL, advantages, losses. Response tensors are (B, T) over generated tokens,
# right-padded; ``mask`` marks real tokens.


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """log π/π_ref per sampled token: unbiased for KL(π‖π_ref) under samples from π, but can be negative."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """½ (log π/π_ref)²: low variance, biased."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """π_ref/π − 1 − log(π_ref/π): unbiased and never negative (Schulman, 2020)."""
    log_ratio = ref_logprobs - logprobs
    return torch.expm1(log_ratio) - log_ratio


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token in a right-padded (B, T) mask."""
    return (mask.sum(-1).long() - 1).clamp(min=0)


def shaped_rewards(
    scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """Per-token rewards: −β·log π/π_ref at every token, plus the sequence score at its last token."""
    rewards = -beta * kl_k1(logprobs, ref_logprobs) * mask
    rows = torch.arange(len(scores), device=scores.device)
    rewards[rows, last_token_index(mask)] += scores
    return rewards


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016); returns (advantages, returns).

    δ_t = r_t + γ V_{t+1} − V_t with V = 0 past the last real token, A_t = Σ_l (γλ)^l δ_{t+l}.
    The recursion runs over time (it is sequential) but every row at once.
    """
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantages[:, t] = (delta + gamma * lam * next_advantage) * mask[:, t]
        next_value = values[:, t] * mask[:, t]
        next_advantage = advantages[:, t]
    return advantages, (advantages + values) * mask


def masked_variance(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean((values - masked_mean(values, mask)) ** 2, mask)


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit variance over the real tokens; padding stays zero."""
    return (values - masked_mean(values, mask)) * torch.rsqrt(masked_variance(values, mask) + eps) * mask


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, token-mean; returns (loss, fraction of tokens where the clip is active).

    ρ = π/π_old is clipped to [1−ε_low, 1+ε_high] (ε_high > ε_low is DAPO's clip-higher).
    """
    ratio = torch.exp(torch.where(mask.bool(), logprobs - old_logprobs, 0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).float(), mask)


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float
) -> torch.Tensor:
    """½ max((V − R)², (V_clip − R)²), V_clip keeping V within ``clip`` of the rollout's values."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * masked_mean(torch.maximum((values - returns) ** 2, (clipped - returns) ** 2), mask)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at every position: (B, T, V) -> (B, T)."""
    logits = logits.float()
    return torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """−log σ(r_chosen − r_rejected), averaged over pairs."""
    return -torch.nn.functional.logsigmoid(chosen - rejected).mean()


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 − Var[R − V] / Var[R] over real tokens: 1 for a perfect critic, ≤ 0 for one no better than a constant."""
    return 1 - masked_variance(returns - values, mask) / masked_variance(returns, mask).clamp(min=1e-8)


def adaptive_kl_coef(coef: float, kl: float, target: float, horizon: int, num_responses: int) -> float:
    """Proportional controller of the KL coefficient (Ziegler et al., 2019): β grows when KL is above target.

    The relative error is clipped to ±0.2 so one noisy batch cannot swing β.
    """
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * num_responses / horizon)
