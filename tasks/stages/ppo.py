"""Stage `ppo`: PPO against the reward model, KL-anchored to the SFT policy (InstructGPT's third stage).

The loop is ``tasks/rl/trainer.py``; ``params.ppo`` picks PPO's parts: a critic and GAE (``advantage: gae``),
the per-token KL penalty in the reward with the adaptive controller, the clipped token-level
surrogate, and the reward model (``rewards: {reward_model: 1.0}``) as the reward.
"""

from tasks.common.artifacts import DATA_DIR, member_dirs, upstream_model
from tasks.common.config import Params
from tasks.rl import trainer as rl


def run(params: Params) -> None:
    rl.train(params, params.ppo, "ppo", upstream_model("sft"), DATA_DIR / "train.jsonl", member_dirs())
