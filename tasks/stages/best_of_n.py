"""Stage `best_of_n`: ``max_n`` samples per held-out prompt from ``best_of_n.policy``; the reward model keeps one.

How much a reward model's ranking is worth before any RL, and where optimising it stops paying, as Gao, Schulman
and Hilton (2022) plot it: for n = 1, 2, 4, … ``max_n``, the gold judge's mean utility of the response the reward
model keeps out of n (``gold``) and the reward model's own score of it (``proxy``), against √KL with
KL = log n − (n − 1)/n, each n's expectation over every n-subset of the samples (``core_algos``). Written to
``gold_vs_proxy.tsv`` (``dvc plots show``) with the peak gold reward and the √KL where it falls.

Headline metrics at ``best_of_n.n``: ``gold_reward@bon<n>`` against ``gold_reward`` (a sample picked at random,
the policy's own level) and ``gold_reward@oracle<n>`` (the judge picking: the most any reward model could get out
of n samples); ``bon_gain@<n>`` is the reward model's gain over random and ``bon_recovered@<n>`` its share of the
oracle's. Sampling uses the eval section's temperature and length, as every held-out number does.
"""

import json
from pathlib import Path

import torch

from tasks.common.artifacts import atomic_output, member_dirs, stage_dir
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live
from tasks.common.training import make_deterministic
from tasks.data.datasets import read_examples
from tasks.data.judge import gold_utility
from tasks.rl.gold_vs_proxy import best_of_n_curve, best_of_n_sizes, peak, write_curve
from tasks.rl.reward_role import RewardWorker
from tasks.rollout.engine import Sampling
from tasks.rollout.hf_engine import policy_engine


def run(stage: StageRun) -> None:
    params, cfg, evaluation = stage.params, stage.config, stage.params.eval
    make_deterministic(params.seed)
    policy, test_file = stage.inputs["policy"], stage.inputs["data"] / "test.jsonl"
    examples = read_examples(test_file)
    engine = policy_engine(params, policy, {test_file: examples}, "eval", evaluation.batch_size)
    sampling = Sampling(evaluation.max_new_tokens, n=cfg.max_n, temperature=evaluation.temperature)
    sampled = engine.generate([e.prompt for e in examples], sampling)  # max_n rows per prompt, prompt by prompt
    # the ensemble combined and scored as PPO does (kinds.yaml declares the keys)
    reward_model = RewardWorker(params, params.ppo, member_dirs(stage.inputs["reward_model"]), policy)
    proxy = reward_model.score([examples[c.prompt_index].prompt for c in sampled], sampled).view(-1, cfg.max_n)
    gold = torch.tensor([gold_utility(examples[c.prompt_index], c.text, c.env_reward) for c in sampled]).view(
        -1, cfg.max_n
    )
    rows = best_of_n_curve(proxy, gold, best_of_n_sizes(cfg.n, cfg.max_n))
    random, (headline,) = rows[0]["gold"], [row for row in rows if row["n"] == cfg.n]
    gain, oracle_gain = headline["gold"] - random, headline["oracle"] - random
    metrics = {
        "gold_reward": random,
        f"gold_reward@bon{cfg.n}": headline["gold"],
        f"gold_reward@oracle{cfg.n}": headline["oracle"],
        f"bon_gain@{cfg.n}": gain,
        f"bon_recovered@{cfg.n}": gain / oracle_gain if oracle_gain > 0 else 0.0,
        **peak(rows),
    }
    favourite = proxy.argmax(1)  # over all max_n samples: what best-of-max_n keeps
    kept = [
        {"prompt": example.prompt, "response": sampled[index * cfg.max_n + pick].text, "gold": gold[index, pick].item()}
        for index, (example, pick) in enumerate(zip(examples, favourite.tolist(), strict=True))
    ]
    with atomic_output(stage_dir("best_of_n")) as out, stage_live("best_of_n") as live:
        out.mkdir()
        (out / "kept.jsonl").write_text("".join(json.dumps(row) + "\n" for row in kept))
        write_curve(Path(live.dir), rows)
        for name, value in metrics.items():
            live.log_metric(name, round(value, 6), plot=False)
    print("best_of_n: " + ", ".join(f"{name}={value:.3f}" for name, value in metrics.items()), flush=True)
