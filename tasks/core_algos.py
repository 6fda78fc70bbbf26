"""Pure algorithm math on tensors: no models, no I/O, no config objects.

Shapes: B sequences, T token positions, V vocabulary. Masks are 1.0 on tokens
that count and 0.0 on prompt and padding tokens.
"""

import torch


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens[:, t]) under logits[:, t]: (B, T, V), (B, T) -> (B, T)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1 (0 when the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


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
