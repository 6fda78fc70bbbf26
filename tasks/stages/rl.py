"""The policy-gradient RL stages: PPO (``ppo``, ``ppo_verifier``) and the GRPO stages of R1 (``grpo``,
``grpo_zero``, ``grpo_final@<round>``). The loop is ``tasks/rl/trainer.py``; which algorithm runs is what
the stage's params section names (``advantage``, ``policy_loss``, ``loss_agg_mode``, ``kl_loss``, ``rewards``),
and where it starts is the ``policy`` its stage kind reads (``tasks/kinds.py``):

- ``ppo``: InstructGPT's third stage, from ``ppo.init`` against the reward model: a critic and GAE, the
  per-token KL penalty in the reward with the adaptive controller, the clipped token-level surrogate;
- ``ppo_verifier``: the reference point, the same PPO rewarded by the exact verifier (``ppo.verifier_rewards``);
- ``grpo``: R1's reasoning RL from the cold-start SFT model; ``grpo_zero``: R1-Zero, the same from the base;
- ``grpo_final@<round>``: a round's final RL from its SFT model, with the rule-based rewards and the reward model;
- ``agent_grpo``: the agent pipeline's GRPO on episodes in its task's environment, from ``agent_sft``.
"""

from dataclasses import replace

from tasks.common.artifacts import member_dirs
from tasks.common.config import RLConfig
from tasks.common.registry import StageRun
from tasks.rl import trainer as rl


def run(stage: StageRun, cfg: RLConfig | None = None) -> None:
    """RL from the stage's ``policy`` on its ``data``'s training prompts, with ``cfg`` (its own section's by
    default), scored by the reward model when the stage reads one."""
    inputs = stage.inputs
    reward_models = member_dirs(inputs["reward_model"]) if "reward_model" in inputs else []
    cfg = cfg or stage.config
    rl.train(stage.params, cfg, stage.name, inputs["policy"], inputs["data"] / "train.jsonl", reward_models)


def run_with_verifier(stage: StageRun) -> None:
    run(stage, replace(stage.config, rewards=dict(stage.config.verifier_rewards)))
