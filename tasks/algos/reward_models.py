"""How a reward model's scores are read: an ensemble's combination rules, registered by name (an RL stage's
``reward_ensemble``), and best-of-n's analytic KL and unbiased expectation (Gao et al., 2022's x axis and curve)."""

import math
from collections.abc import Callable

import torch
from torch import Tensor

from tasks.common.registry_type import Registry

# How a reward-model ensemble's scores combine (an RL stage's ``reward_ensemble``): (M members, N responses) -> (N,).
REWARD_ENSEMBLES: Registry[Callable[[Tensor, float], Tensor]] = Registry("reward ensemble rule")


@REWARD_ENSEMBLES.register("mean")
def ensemble_mean(scores: torch.Tensor, std_coef: float) -> torch.Tensor:
    return scores.mean(0)


@REWARD_ENSEMBLES.register("min")
def ensemble_min(scores: torch.Tensor, std_coef: float) -> torch.Tensor:
    """The worst case over members (Coste et al., 2024)."""
    return scores.min(0).values


@REWARD_ENSEMBLES.register("mean_minus_std")
def ensemble_mean_minus_std(scores: torch.Tensor, std_coef: float) -> torch.Tensor:
    """mean − λ·std over members: uncertainty-weighted optimisation (Coste et al., 2024); one member has std 0."""
    return scores.mean(0) - std_coef * scores.std(0, correction=0)


def best_of_n_kl(n: int) -> float:
    """KL(best-of-n ‖ the policy) = log n − (n − 1)/n, the analytic bound Gao et al. (2022) plot best-of-n at."""
    return math.log(n) - (n - 1) / n


def best_of_n_expectation(proxy: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """(P,) the expected value of the response a proxy keeps out of n drawn at random from each prompt's N samples.

    proxy, values: (P, N). Unbiased over all n-subsets (Nakano et al., 2021): ranked by proxy in ascending order,
    the i-th of N (1-based) is a subset's favourite with probability C(i−1, n−1)/C(N, n). Ties keep sample order.
    """
    num_samples = proxy.shape[1]
    ranked = values.double().gather(1, proxy.argsort(dim=1, stable=True))
    rank = torch.arange(1, num_samples + 1, dtype=torch.float64)
    log_choose = torch.lgamma(rank) - math.lgamma(n) - torch.lgamma((rank - n + 1).clamp(min=1))
    log_total = math.lgamma(num_samples + 1) - math.lgamma(n + 1) - math.lgamma(num_samples - n + 1)
    weights = torch.where(rank >= n, torch.exp(log_choose - log_total), 0.0)
    return ranked @ weights
