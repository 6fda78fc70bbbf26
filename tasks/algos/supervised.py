"""The losses and metrics of the stages that do not run RL: next-token NLL (SFT), the Bradley-Terry pairwise loss
(reward models), unbiased pass@k (evaluation)."""

import torch

from tasks.algos.tokens import masked_mean, token_logprobs


def sft_loss(
    logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, num_tokens: torch.Tensor | None = None
) -> torch.Tensor:
    """Next-token negative log-likelihood averaged over the tokens ``loss_mask`` marks (the response).

    logits (B, T, V) predict input_ids shifted by one; loss_mask (B, T) marks target tokens. ``num_tokens``: what
    to divide the sum by when these rows are one worker's slice of a batch (the whole batch's target tokens);
    None divides by this batch's own.
    """
    logprobs = token_logprobs(logits[:, :-1], input_ids[:, 1:])
    if num_tokens is None:
        return -masked_mean(logprobs, loss_mask[:, 1:])
    return -(logprobs * loss_mask[:, 1:]).sum() / num_tokens


def pass_at_k(num_samples: int, num_correct: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased pass@k per problem from n samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    n, c = float(num_samples), num_correct.double()
    # C(n-c, k)/C(n, k) = prod_{i=0}^{k-1} (n-c-i)/(n-i); a factor hits zero once c > n-k.
    i = torch.arange(k, dtype=torch.float64)
    ratio = ((n - c.unsqueeze(-1) - i).clamp(min=0) / (n - i)).prod(-1)
    return 1.0 - ratio


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """−log σ(r_chosen − r_rejected), averaged over pairs."""
    return -torch.nn.functional.logsigmoid(chosen - rejected).mean()
