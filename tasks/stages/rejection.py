"""Stage `rejection@<round>`: R1's rejection sampling, the data of the round's second SFT.

From the policy the round names (``rounds.<round>.policy``: the reasoning-RL checkpoint for round
1), sample ``samples_per_prompt`` responses to each of ``num_prompts`` training prompts and keep the
ones the task's verifier accepts (``tasks/stages/rejection_sampling.py``; for a task without a verifier,
the ``top_by_reward_model`` best by the RLHF reward model), then mix in ``general_ratio`` general SFT
rows per kept one (worked solutions of training prompts not sampled). The result is an SFT dataset
(``train.jsonl``) with its statistics: the acceptance rate overall and by difficulty.
"""

from pathlib import Path

import torch

from models import resolve_device
from tasks.common.artifacts import atomic_output, member_dirs, stage_dir
from tasks.common.config import Params
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live
from tasks.common.training import make_deterministic
from tasks.data.datasets import read_examples, write_jsonl
from tasks.data.problems import Example
from tasks.data.prompts import PromptFormat
from tasks.rl.reward_kinds import RewardModel
from tasks.stages.rejection_sampling import Ranker, has_verifier, sample_and_verify


def _reward_model_ranker(params: Params, reward_model: Path) -> Ranker:
    """Scores texts with the first RLHF reward model; loaded only when a task has no verifier."""
    (first, *_) = member_dirs(reward_model)
    member, prompt_format = RewardModel(first, resolve_device(params.device)), PromptFormat.of(params.task)

    def rank(example: Example, responses: list[str]) -> list[float]:
        prompts = [example.prompt] * len(responses)
        return member.score_texts(prompt_format, prompts, responses, params.eval.batch_size).tolist()

    return rank


def run(stage: StageRun) -> None:
    params, cfg, inputs = stage.params, stage.config, stage.inputs
    policy = inputs["policy"]
    make_deterministic(params.seed)
    train_file = inputs["data"] / "train.jsonl"
    examples = read_examples(train_file)
    prompts, others = examples[: cfg.num_prompts], examples[cfg.num_prompts :]
    rank = None if all(has_verifier(e) for e in prompts) else _reward_model_ranker(params, inputs["reward_model"])
    kept, statistics = sample_and_verify(
        params, cfg, "rejection", policy, prompts, train_file, rank, cfg.top_by_reward_model
    )
    if not kept:
        raise ValueError(f"{stage.name}: no sampled response was accepted; nothing to train on")
    general_count = min(len(others), round(cfg.general_ratio * len(kept)))
    order = torch.randperm(len(others), generator=torch.Generator().manual_seed(params.seed)).tolist()
    general = [others[i] for i in sorted(order[:general_count])]

    with atomic_output(stage_dir(stage.name)) as out, stage_live(stage.name) as live:
        out.mkdir()
        write_jsonl(out / "train.jsonl", kept + general)
        for name, value in statistics.items():
            live.log_metric(name, int(value) if name == "accepted" else value, plot=False)
        live.log_metric("general", len(general), plot=False)
    print(f"{stage}: kept {len(kept)} accepted responses + {len(general)} general rows", flush=True)
