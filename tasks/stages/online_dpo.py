"""Stage `online_dpo`: online preference optimisation from the offline checkpoint (``online_dpo.init``, dpo).

The RL trainer's loop (``tasks/rl/trainer.py``) with the update ``online_dpo.update`` names: ``preference``
(online DPO, ``tasks/rl/online_preference.py``; ``sync_every`` > 1 is semi-online) or ``policy_gradient``
(the GRPO/PPO update of the same params, from the same start). Every ``heldout_every`` iterations the
policy is sampled on a fixed held-out slice; the summary's ``dip`` is the largest fall of that held-out
gold reward below the offline checkpoint's before it comes back, ``recovery_iterations`` when it does.
"""

from tasks.common.registry import StageRun
from tasks.rl import trainer as rl
from tasks.rl.online_preference import ONLINE_PREFERENCE
from tasks.rl.policy_gradient import POLICY_GRADIENT

LEARNERS = {"preference": ONLINE_PREFERENCE, "policy_gradient": POLICY_GRADIENT}


def run(stage: StageRun) -> None:
    cfg, inputs = stage.config, stage.inputs
    rl.train(stage.params, cfg, stage.name, inputs["policy"], inputs["data"] / "train.jsonl", [], LEARNERS[cfg.update])
