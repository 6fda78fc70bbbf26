"""What a learner is, and what the learners share: the scored rollout they train on, the loop's state they read
and update, and the metrics of a policy's drift.

A ``Learner`` (the policy gradient, ``tasks/rl/policy_gradient.py``; the online preference update,
``online_preference.py``; on-policy distillation, ``distillation.py``) is the one plug-in point of the RL loop
(``tasks/rl/trainer.py``): it names the roles it needs and trains one scored rollout, handing the actor the
``ActorLoss`` its update minimises (``tasks/rl/workers.py``).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tasks.algos.tokens import masked_mean
from tasks.common.config import RLConfig
from tasks.data.problems import Example
from tasks.rl.core_algos import kl_k1
from tasks.rl.rewards import REWARD_MODEL
from tasks.rl.sequences import PackedBatch, pack
from tasks.rollout.engine import Completion


@dataclass
class RunningMoments:
    """Mean and variance of every score seen so far (Chan et al.'s parallel update)."""

    count: float = 0.0
    mean: float = 0.0
    var: float = 1.0

    def update(self, values: torch.Tensor) -> None:
        batch_mean, batch_var, n = values.mean().item(), values.var(unbiased=False).item(), len(values)
        total = self.count + n
        delta = batch_mean - self.mean
        self.var = (self.count * self.var + n * batch_var + delta**2 * self.count * n / total) / total
        self.mean += delta * n / total
        self.count = total

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        return (values - self.mean) / math.sqrt(self.var + 1e-8)


@dataclass
class LoopState:
    """What a resumed run needs besides the models: where it is, and what it has learned about its rewards."""

    step: int = 0
    cursor: int = 0  # prompt batches drawn so far (dynamic sampling draws more than one per iteration)
    kl_coef: float = 0.0
    moments: RunningMoments = field(default_factory=RunningMoments)
    history: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    # an agent task's episodes, every iteration's, as the stage writes them (EPISODES_FILE beside the model)
    episodes: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Rollout:
    """Scored responses, ``group_size`` consecutive ones per prompt."""

    examples: list[Example]  # the problem of each response
    completions: list[Completion]
    scores: torch.Tensor  # (N,) the weighted sum of the reward functions
    components: dict[str, torch.Tensor]  # (N,) each reward function's own reward
    failures: dict[str, int]
    on_policy: bool = True  # False: responses taken from a dataset (a teacher's), not sampled from the policy

    def packed(self, tokenizer, rows: list[int] | None = None) -> PackedBatch:
        """The responses of ``rows`` (all by default) packed after their prompts: exactly the token ids the engine
        read and sampled (with a BPE tokenizer, decoding and re-encoding them need not give them back); an episode's
        response mask covers its model turns only, never an observation."""
        rows = range(len(self.completions)) if rows is None else rows
        chosen = [self.completions[row] for row in rows]
        prompts, responses = [c.prompt_ids for c in chosen], [c.token_ids for c in chosen]
        return pack(prompts, responses, tokenizer.pad_token_id, [c.mask for c in chosen])

    def tokens(self) -> int:
        """Real tokens of every row: its prompt's and its response's (what a training pass over it computes)."""
        return sum(len(c.prompt_ids) + len(c.token_ids) for c in self.completions)

    def groups(self, keep: torch.Tensor, group_size: int) -> "Rollout":
        rows = torch.arange(len(self.scores)).view(-1, group_size)[keep].flatten().tolist()
        return Rollout(
            [self.examples[i] for i in rows],
            [self.completions[i] for i in rows],
            self.scores[rows],
            {name: values[rows] for name, values in self.components.items()},
            self.failures,
        )

    @staticmethod
    def join(parts: list["Rollout"]) -> "Rollout":
        failures: dict[str, int] = {}
        for part in parts:
            for name, count in part.failures.items():
                failures[name] = failures.get(name, 0) + count
        return Rollout(
            [e for part in parts for e in part.examples],
            [c for part in parts for c in part.completions],
            torch.cat([part.scores for part in parts]),
            {name: torch.cat([part.components[name] for part in parts]) for name in parts[0].components},
            failures,
        )


@dataclass(frozen=True)
class Learner:
    """What an iteration's scored rollout trains, and the roles besides the actor that it needs: the stage picks
    one (``POLICY_GRADIENT``, ``ONLINE_PREFERENCE``, ``distillation_learner``)."""

    roles: Callable[[RLConfig], set[str]]
    learn: Callable[..., dict[str, float]]  # (roles, rollout, tokenizer, cfg, state, clock) -> metrics
    # The responses of iteration i when they do not come from the policy (GKD's teacher batches): a Rollout, or
    # None to sample as usual.
    offline: Callable[[int], Rollout | None] | None = None
    inputs: tuple[Path, ...] = ()  # files it reads besides the policy and the prompts: a resume must see the same


def reward_roles(cfg: RLConfig) -> set[str]:
    """The reward model's role, when the rewards weigh it."""
    return {"reward"} if cfg.rewards.get(REWARD_MODEL, 0.0) else set()


def prepare_scores(raw: torch.Tensor, cfg: RLConfig, moments: RunningMoments) -> torch.Tensor:
    """The scores an advantage estimator sees: normalised by the running ``moments`` and clipped, when asked."""
    scores = raw
    if cfg.reward_normalize:
        moments.update(raw)
        scores = moments.normalize(raw)
    if cfg.reward_clip is not None:
        scores = scores.clamp(-cfg.reward_clip, cfg.reward_clip)
    return scores


def sampled_logprobs(completions: list[Completion], mask: torch.Tensor) -> torch.Tensor:
    """(B, T): the log-prob the rollout engine sampled each response token with."""
    logprobs = torch.zeros_like(mask)
    for row, completion in enumerate(completions):
        logprobs[row, : len(completion.logprobs)] = torch.tensor(completion.logprobs)
    return logprobs


def policy_metrics(
    engine_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    engines: list[int] | None = None,
) -> dict[str, float]:
    """Parity (the engine's log-probs against the trainer's, per token; semi-online this includes the policy's
    drift since the engine's last sync), response length, and the KL to the reference per response. ``engines``:
    the replica that sampled each row; with more than one, each replica's parity too (``logprob_parity_engine_i``)."""
    gap = (engine_logprobs - logprobs).abs()
    metrics = {"logprob_parity": masked_mean(gap, mask).item(), "response_length": mask.sum(-1).mean().item()}
    replicas = torch.tensor(engines or [0] * len(mask))
    if len(replicas.unique()) > 1:
        for replica in replicas.unique().tolist():
            rows = replicas == replica
            metrics[f"logprob_parity_engine_{replica}"] = masked_mean(gap[rows], mask[rows]).item()
    if ref_logprobs is not None:
        metrics["kl"] = (kl_k1(logprobs, ref_logprobs) * mask).sum(-1).mean().item()
    return metrics
