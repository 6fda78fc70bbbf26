"""The online preference update (online and semi-online DPO): a ``Learner`` for the RL trainer's loop.

Each iteration's rollout holds ``group_size`` scored responses per prompt; the best and the worst of each
group become a pair (a group of equal scores makes none: dynamic sampling refills the batch with groups
that differ), the reference scores both, and the actor takes the registered preference loss on them
(``ActorWorker.preference_update``). The reference is the policy the stage started from, held fixed as in
iterative DPO. The engine samples from a policy refreshed every ``sync_every`` updates.
"""

import time

from tasks.common.config import OnlineDPOConfig
from tasks.rl.preference_losses import PREFERENCE_LOSSES, best_and_worst
from tasks.rl.trainer import Learner, LoopState, Rollout, policy_metrics, reward_roles, sampled_logprobs
from tasks.rl.workers import Worker


def preference_roles(cfg: OnlineDPOConfig) -> set[str]:
    return ({"reference"} if PREFERENCE_LOSSES[cfg.preference_loss].needs_reference else set()) | reward_roles(cfg)


def learn_preferences(
    roles: dict[str, Worker],
    rollout: Rollout,
    tokenizer,
    cfg: OnlineDPOConfig,
    state: LoopState,
    clock: dict[str, float],
) -> dict[str, float]:
    started = time.perf_counter()
    chosen, rejected = best_and_worst(rollout.scores, cfg.group_size)
    if len(chosen) == 0:
        return {"pairs": 0.0}
    rows = [*chosen.tolist(), *rejected.tolist()]
    completions = [rollout.completions[row] for row in rows]
    batch = rollout.packed(tokenizer, rows)
    ref_logprobs = roles["reference"].call("logprobs", batch).result() if "reference" in roles else None
    passed = time.perf_counter()
    clock["time/score"] += passed - started
    metrics, logprobs = roles["actor"].call("preference_update", batch, ref_logprobs).result()
    clock["time/train"] += time.perf_counter() - passed
    mask = batch.response_mask
    return {
        "pairs": float(len(chosen)),
        **metrics,
        **policy_metrics(
            sampled_logprobs(completions, mask), logprobs, ref_logprobs, mask, [c.engine for c in completions]
        ),
    }


ONLINE_PREFERENCE = Learner(preference_roles, learn_preferences)
