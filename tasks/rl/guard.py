"""The over-optimisation guard: which iteration of an RL stage becomes its artifact, decided without the gold judge.

A policy trained on a learned reward can raise that reward while getting worse (Gao et al., 2022): the reward model
is exploited. The guard watches a signal the policy is not trained on. Before the first iteration, every
``guard.every`` iterations and after the last, the policy answers a fixed probe of prompts (``group_size`` samples
each, from a seed of its own: the training's random streams are left as they were; with ``guard.greedy``, one greedy
answer each) and ``guard.signal`` judges the answers. The probe is the first ``guard.prompts`` of the training split,
or, with ``guard.held_out``, its last ones, which training then never draws: a probe of prompts the policy is
trained on rewards what it learnt on them, and a sampled probe rises as RL sharpens sampling, while held-out pass@1
reads greedy answers to prompts never seen.

- ``judge``: the reward model's judge, trained on the held-out preference pairs, which the training reward never saw
  (``reward_model.judge``); a real gain raises both, an exploited quirk of the training reward raises only it;
- ``ensemble``: the members' conservative score, mean − λ·std (Coste et al., 2024): responses the members disagree
  on are worth less;
- ``verifier``: the share of the answers the task's verifier marks correct, for a stage that is not trained on it
  (on-policy distillation, whose signal is the teacher: a teacher weaker than the student pulls it down), or for any
  stage on held-out prompts (early stopping on a validation split).

The probe the signal rates best is kept: a later probe replaces the kept one when its score is higher by more than
``guard.min_gain`` and, with ``guard.min_z`` > 0, by more than ``min_z`` paired standard errors of their per-prompt
scores (the probe's prompts are the same each time, so the difference is paired): a later iteration must show
it is better, not merely score higher by noise. Its weights are snapshotted, and the stage saves them instead of the
last iteration's. Every probe logs ``guard/score``,
``guard/disagreement`` (the members' spread, when there is a reward model) and, for the curves only,
``guard/gold_reward`` (never read here);
``guard.json`` beside the model names the iteration kept and why.
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tasks.common.config import RLConfig
from tasks.data.judge import gold_utility
from tasks.data.problems import Example, score_response
from tasks.rl.role_handles import Roles
from tasks.rollout.engine import Sampling

GUARD_FILE = "guard.json"


def guard_signal(cfg: RLConfig, rewarded_by_model: bool, has_judge: bool) -> str | None:
    """The signal ``cfg.guard`` asks for, ``auto`` resolved (None: no guard); ValueError naming the key when it
    cannot be had."""
    signal = cfg.guard.signal
    sharded = cfg.parallel.strategy == "fsdp" and cfg.parallel.num_workers > 1  # no whole copy of the weights
    if signal == "auto":
        return "judge" if rewarded_by_model and has_judge and not sharded else None
    if signal == "none":
        return None
    if signal == "verifier":  # params' rules refuse it for a stage trained on the verifier's reward, unless held out
        return signal
    if not rewarded_by_model:
        raise ValueError(f"guard.signal={signal}: the stage is not rewarded by a reward model (rewards.reward_model)")
    if signal == "judge" and not has_judge:
        raise ValueError(
            "guard.signal=judge: the reward model has no judge (set reward_model.judge=true and re-run reward_model)"
        )
    return signal


def probe_split(examples: list[Example], cfg: RLConfig, section: str) -> tuple[list[Example], list[Example]]:
    """The prompts training draws from and the guard's probe: the first ``guard.prompts``, shared, or with
    ``guard.held_out`` the last ones, taken out of training; ValueError naming the key when too few are left."""
    count = cfg.guard.prompts
    if not cfg.guard.held_out:
        return examples, examples[:count]
    if len(examples) - count < cfg.rollout_batch_size:
        raise ValueError(
            f"{section}.guard.prompts: holding out {count} of {len(examples)} training prompts ({section}.guard."
            f"held_out) leaves fewer than {section}.rollout_batch_size={cfg.rollout_batch_size} to train on"
        )
    return examples[:-count], examples[-count:]


def clearly_better(scores: torch.Tensor, kept: torch.Tensor, min_z: float) -> bool:
    """Whether per-prompt ``scores`` beat the ``kept`` probe's on the same prompts by more than ``min_z`` standard
    errors of the paired difference (its mean over its sample standard deviation / sqrt(prompts))."""
    difference = (scores - kept).double()
    mean = difference.mean().item()
    if len(difference) < 2:
        return mean > 0
    return mean > min_z * difference.std(correction=1).item() / math.sqrt(len(difference))


@dataclass
class Guard:
    """The probes so far, and the iteration kept with its weights (None until the first probe)."""

    signal: str
    probe: list[Example]
    probes: list[dict[str, float]] = field(default_factory=list)
    kept_step: int | None = None
    kept_score: float = float("-inf")
    kept_weights: dict[str, torch.Tensor] | None = None
    kept_per_prompt: torch.Tensor | None = None  # the kept probe's per-prompt scores, for guard.min_z

    def due(self, step: int, cfg: RLConfig) -> bool:
        """Whether iteration ``step`` (0: before the first) ends with a probe."""
        return step % cfg.guard.every == 0 or step == cfg.steps

    def judge(self, roles: Roles, step: int, cfg: RLConfig, seed: int) -> dict[str, float]:
        """Probe the policy as it is after iteration ``step``: its metrics, and the weights kept when the signal
        rates it best."""
        if cfg.guard.greedy:
            sampling = Sampling(cfg.max_new_tokens, greedy=True)
        else:
            sampling = Sampling(cfg.max_new_tokens, n=cfg.group_size, temperature=cfg.temperature)
        prompts = [e.prompt for e in self.probe]
        completions = roles.actor.sample_current(prompts, sampling, seed).result()
        per_response = [prompts[c.prompt_index] for c in completions]
        judged = roles.reward.judge_scores(per_response, completions).result() if roles.reward else {}
        if self.signal == "verifier":
            verdicts = [score_response(self.probe[c.prompt_index], c.text, c.env_reward)[1] for c in completions]
            judged["verifier"] = torch.tensor(verdicts, dtype=torch.float64)
        gold = [gold_utility(self.probe[c.prompt_index], c.text, c.env_reward) for c in completions]
        score = judged[self.signal].mean().item()
        scores = judged[self.signal].view(len(prompts), -1).mean(1)  # each prompt's answers, in a row
        metrics = {"guard/score": score}
        if "disagreement" in judged:
            metrics["guard/disagreement"] = judged["disagreement"].mean().item()
        metrics["guard/gold_reward"] = sum(gold) / len(gold)  # for the curves: the choice never reads it
        higher = score > self.kept_score + cfg.guard.min_gain
        if self.kept_step is None or (
            higher and (cfg.guard.min_z == 0 or clearly_better(scores, self.kept_per_prompt, cfg.guard.min_z))
        ):
            self.kept_step, self.kept_score, self.kept_per_prompt = step, score, scores
            self.kept_weights = roles.actor.weights().result()
        metrics["guard/kept_iteration"] = float(self.kept_step)
        self.probes.append({"step": step, **metrics})
        return metrics

    def report(self, last_step: int) -> dict[str, Any]:
        """What ``guard.json`` holds: the signal, the iteration kept and why, every probe."""
        if self.kept_step == last_step:
            why = f"the last iteration's probe scored highest by {self.signal} ({self.kept_score:.4f})"
        else:
            last = self.probes[-1]["guard/score"]
            # a later probe replaces the kept one only when clearly higher: a tie or a gain inside the margins keeps it
            verdict = "lower" if last < self.kept_score else "not higher by more than guard.min_gain and guard.min_z"
            why = (
                f"iteration {self.kept_step}'s probe scored {self.kept_score:.4f} by {self.signal}; the last "
                f"iteration's ({last_step}) {last:.4f}, {verdict}"
            )
        return {"signal": self.signal, "kept_iteration": self.kept_step, "why": why, "probes": self.probes}

    def write(self, out: Path, last_step: int) -> None:
        (out / GUARD_FILE).write_text(json.dumps(self.report(last_step), indent=1) + "\n")

    def state(self) -> dict[str, Any]:
        return {
            "probes": self.probes,
            "kept_step": self.kept_step,
            "kept_score": self.kept_score,
            "kept_weights": self.kept_weights,
            "kept_per_prompt": self.kept_per_prompt,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.probes, self.kept_step = state["probes"], state["kept_step"]
        self.kept_score, self.kept_weights = state["kept_score"], state["kept_weights"]
        self.kept_per_prompt = state["kept_per_prompt"]
