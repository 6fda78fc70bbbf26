"""The hidden gold judge: the utility a response really has, and noisy human-like preference labels.

Utility is lexicographic in spirit: a correct answer (0.7) outweighs formatting (0.2),
which outweighs concision (0.1 · min(1, reference length / response length): no
penalty for being as short as the worked solution, a growing one for rambling), so
utility lies in [0, 1] and a correct, concise response scores 1. Two responses of
equal utility (say, both wrong in the same length) are a tie and never make a pair.
Labels follow Bradley–Terry noise around the utility:
P(a preferred to b) = σ((u_a − u_b) / label_noise), like annotators who usually, not
always, pick the better response; label_noise = 0 gives the judge's own order.
"""

import math
import random

import torch

from tasks.data.datasets import PreferencePair
from tasks.data.problems import Example, score_response

CORRECT_WEIGHT, FORMAT_WEIGHT, CONCISION_WEIGHT = 0.7, 0.2, 0.1


def gold_utility(example: Example, response: str, env_reward: float | None = None) -> float:
    formatted, correct = score_response(example, response, env_reward)
    concision = min(1.0, len(example.solution) / max(1, len(response.strip())))
    return CORRECT_WEIGHT * correct + FORMAT_WEIGHT * formatted + CONCISION_WEIGHT * concision


def prefers_first(utility_a: float, utility_b: float, label_noise: float, rng: random.Random) -> bool:
    """A noisy annotator's choice between two responses of different utility."""
    if label_noise == 0:
        return utility_a > utility_b
    probability = 1.0 / (1.0 + math.exp(-(utility_a - utility_b) / label_noise))
    return rng.random() < probability


def preference_metrics(chosen: torch.Tensor, rejected: torch.Tensor, pairs: list[PreferencePair]) -> dict[str, float]:
    """How well scores of the chosen and rejected responses (a reward model's, or DPO's implicit rewards) rank
    ``pairs``: ``accuracy`` against the gold judge's noise-free order (rows that carry it), ``label_accuracy``
    against the labels as given, the mean margin of the better response over the worse, and the mean scores."""
    gold = [pair.gold_prefers_chosen for pair in pairs]
    known = torch.tensor([verdict is not None for verdict in gold])
    gold_chosen_better = torch.tensor([bool(verdict) for verdict in gold])
    # The margin of the better response over the worse, by the judge when it is known, else by the label.
    margin = torch.where(known & ~gold_chosen_better, rejected - chosen, chosen - rejected)
    metrics = {
        "label_accuracy": (chosen > rejected).float().mean().item(),
        "margin": margin.mean().item(),
        "reward_chosen": chosen.mean().item(),
        "reward_rejected": rejected.mean().item(),
    }
    if known.any():
        metrics["accuracy"] = (margin[known] > 0).float().mean().item()
    return metrics
