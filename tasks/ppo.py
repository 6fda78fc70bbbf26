"""Stage `ppo`: PPO against the reward model, KL-anchored to the SFT policy (InstructGPT's third stage).

The loop is ``tasks/rl.py``; ``params.ppo`` picks PPO's parts: a critic and GAE (``advantage: gae``),
the per-token KL penalty in the reward with the adaptive controller, the clipped token-level
surrogate, and the reward model (``rewards: {reward_model: 1.0}``) as the reward.
"""

from tasks import rl
from tasks.artifacts import DATA_DIR, model_dir
from tasks.config import Params
from tasks.reward import REWARD_DIR, member_dirs


def run(params: Params) -> None:
    rl.train(params, params.ppo, "ppo", model_dir("sft"), DATA_DIR / "train.jsonl", member_dirs(REWARD_DIR))
