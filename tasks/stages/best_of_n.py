"""Stage `best_of_n`: n samples per held-out prompt from ``best_of_n.policy``, the reward model keeps one.

``gold_reward@bon<n>`` is the gold judge's mean utility of the kept responses: how much a reward model's
ranking is worth before any RL, against ``gold_reward`` (a sample picked at random, the policy's own level)
and ``gold_reward@oracle<n>`` (the judge picking: the most any reward model could get out of these samples).
Sampling uses the eval section's temperature and length, as every held-out number does.
"""

import json

import torch

from tasks.common.artifacts import atomic_output, member_dirs, stage_dir
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live
from tasks.common.training import make_deterministic
from tasks.data.datasets import read_examples
from tasks.data.judge import gold_utility
from tasks.rl.workers import RewardWorker
from tasks.rollout.engine import Sampling
from tasks.rollout.hf_engine import policy_engine


def run(stage: StageRun) -> None:
    params, cfg, evaluation = stage.params, stage.config, stage.params.eval
    make_deterministic(params.seed)
    policy, test_file = stage.inputs["policy"], stage.inputs["data"] / "test.jsonl"
    examples = read_examples(test_file)
    new_tokens = ("eval.max_new_tokens", evaluation.max_new_tokens)
    engine = policy_engine(params, policy, {test_file: examples}, new_tokens, evaluation.batch_size)
    sampling = Sampling(evaluation.max_new_tokens, n=cfg.n, temperature=evaluation.temperature)
    sampled = engine.generate([e.prompt for e in examples], sampling)  # n rows per prompt, prompt by prompt
    # the ensemble combined as PPO combines it
    reward_model = RewardWorker(params, params.ppo, member_dirs(stage.inputs["reward_model"]), policy)
    scores = reward_model.score([examples[c.prompt_index].prompt for c in sampled], sampled)
    gold = torch.tensor([gold_utility(examples[c.prompt_index], c.text) for c in sampled]).view(-1, cfg.n)
    favourite = scores.view(-1, cfg.n).argmax(1)  # (prompts,)
    kept = gold.gather(1, favourite[:, None]).squeeze(1)
    metrics = {
        f"gold_reward@bon{cfg.n}": kept.mean().item(),
        "gold_reward": gold.mean().item(),
        f"gold_reward@oracle{cfg.n}": gold.max(1).values.mean().item(),
    }
    rows = [
        {"prompt": example.prompt, "response": sampled[index * cfg.n + pick].text, "gold": round(value, 6)}
        for index, (example, pick, value) in enumerate(zip(examples, favourite.tolist(), kept.tolist(), strict=True))
    ]
    with atomic_output(stage_dir("best_of_n")) as out, stage_live("best_of_n") as live:
        out.mkdir()
        (out / "kept.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        for name, value in metrics.items():
            live.log_metric(name, round(value, 6), plot=False)
    print("best_of_n: " + ", ".join(f"{name}={value:.3f}" for name, value in metrics.items()), flush=True)
