"""Stage `ppo`: PPO against the reward model, KL-anchored to the policy it starts from, ``ppo.init``
(InstructGPT's third stage).

The loop is ``tasks/rl/trainer.py``; ``params.ppo`` picks PPO's parts: a critic and GAE (``advantage: gae``),
the per-token KL penalty in the reward with the adaptive controller, the clipped token-level
surrogate, and the reward model (``rewards: {reward_model: 1.0}``) as the reward.
"""

from dataclasses import replace

from tasks.common.artifacts import DATA_DIR, member_dirs, upstream_model
from tasks.common.config import Params
from tasks.rl import trainer as rl


def run(params: Params) -> None:
    rl.train(params, params.ppo, "ppo", upstream_model(params.ppo.init), DATA_DIR / "train.jsonl", member_dirs())


def run_with_verifier(params: Params) -> None:
    cfg = replace(params.ppo, rewards=dict(params.ppo.verifier_rewards))
    rl.train(params, cfg, "ppo_verifier", upstream_model(cfg.init), DATA_DIR / "train.jsonl", [])
