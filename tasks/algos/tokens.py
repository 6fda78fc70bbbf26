"""Token-level tensor utilities: log-probs of given tokens, masks, masked moments, entropy.

Shapes: B sequences, T token positions, V vocabulary. Masks are 1.0 on tokens that count and 0.0 on prompt and
padding tokens.
"""

import torch


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens[:, t]) under logits[:, t]: (B, T, V), (B, T) -> (B, T)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` with 0 where ``mask`` is 0: padding is selected away, not multiplied by zero, so inf or nan there
    cannot leak in."""
    return torch.where(mask.bool(), values, 0)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1 (0 when the mask is empty)."""
    return masked(values, mask).sum() / mask.sum().clamp(min=1)


def masked_variance(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean((values - masked_mean(values, mask)) ** 2, mask)


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit variance over the real tokens; padding stays zero."""
    return (values - masked_mean(values, mask)) * torch.rsqrt(masked_variance(values, mask) + eps) * mask


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at every position: (B, T, V) -> (B, T)."""
    logits = logits.float()
    return torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)
