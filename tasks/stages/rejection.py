"""Stage `rejection@<round>`: R1's rejection sampling, the data of the round's second SFT.

From the policy the round names (``rounds.<round>.policy``: the reasoning-RL checkpoint for round
1), sample ``samples_per_prompt`` responses to each of ``num_prompts`` training prompts. Keep the
responses the task's verifier accepts (for a task without a verifier, the ``top_by_reward_model``
best by the RLHF reward model), drop duplicates, keep at most ``max_per_prompt`` per prompt, then
mix in ``general_ratio`` general SFT rows per kept one (worked solutions of training prompts not
sampled). The result is an SFT dataset (``train.jsonl``) with its statistics: the acceptance rate
overall and by difficulty (for arithmetic, by operation).
"""

from collections import defaultdict

import torch

from models import context_length, load_policy, load_tokenizer, resolve_device
from tasks.common.artifacts import DATA_DIR, atomic_output, member_dirs, stage_dir, upstream_model
from tasks.common.config import Params, RejectionConfig
from tasks.common.tracking import stage_live
from tasks.common.training import make_deterministic
from tasks.data.datasets import check_prompt_lengths, read_examples, write_jsonl
from tasks.data.problems import PROBLEMS, Example, score_response
from tasks.rl.sequences import score_texts
from tasks.rollout.engine import Sampling
from tasks.rollout.hf_engine import HFEngine


def has_verifier(example: Example) -> bool:
    return getattr(PROBLEMS[example.task], "is_correct", None) is not None


def accepted(example: Example, responses: list[str], cfg: RejectionConfig, rank=None) -> list[str]:
    """The responses to keep for one prompt: verified ones (or the best by ``rank``, a scorer of texts, for a task
    without a verifier), distinct, at most ``max_per_prompt``, in sampling order."""
    distinct = list(dict.fromkeys(r for r in responses if r.strip()))
    if has_verifier(example):
        return [r for r in distinct if score_response(example, r) == (True, True)][: cfg.max_per_prompt]
    scores = rank(example, distinct)
    best = sorted(range(len(distinct)), key=lambda i: -scores[i])[: min(cfg.top_by_reward_model, cfg.max_per_prompt)]
    return [distinct[i] for i in sorted(best)]


def _reward_model_ranker(params: Params):
    """Scores texts with the first RLHF reward model; loaded only when a task has no verifier."""
    from models import load_reward_model

    (first, *_) = member_dirs()
    model, tokenizer = load_reward_model(first, resolve_device(params.device)), load_tokenizer(first)

    def rank(example: Example, responses: list[str]) -> list[float]:
        prompts = [example.prompt] * len(responses)
        return score_texts(model, tokenizer, prompts, responses, params.eval.batch_size).tolist()

    return rank


def run(params: Params, round_name: str) -> None:
    cfg = params.rejection
    if round_name not in params.rounds:
        raise ValueError(f"rejection@{round_name}: no round {round_name!r} in rounds ({', '.join(params.rounds)})")
    policy = upstream_model(params.rounds[round_name].policy)
    make_deterministic(params.seed)
    examples = read_examples(DATA_DIR / "train.jsonl")
    prompts, others = examples[: cfg.num_prompts], examples[cfg.num_prompts :]
    tokenizer = load_tokenizer(policy)
    new_tokens = ("rejection.max_new_tokens", cfg.max_new_tokens)
    train_file = DATA_DIR / "train.jsonl"
    check_prompt_lengths(
        prompts, tokenizer, train_file, params.sft.max_prompt_length, context_length(policy), new_tokens
    )
    model = load_policy(policy, resolve_device(params.device))
    engine = HFEngine(model, tokenizer, params.eval.batch_size)
    sampling = Sampling(cfg.max_new_tokens, n=cfg.samples_per_prompt, temperature=cfg.temperature)
    completions = engine.generate([e.prompt for e in prompts], sampling)
    rank = None if all(has_verifier(e) for e in prompts) else _reward_model_ranker(params)

    kept: list[Example] = []
    sampled, verified = defaultdict(int), defaultdict(int)
    for index, example in enumerate(prompts):
        group = [c.text for c in completions[index * cfg.samples_per_prompt : (index + 1) * cfg.samples_per_prompt]]
        if has_verifier(example):
            label = PROBLEMS[example.task].difficulty(example)
            sampled[label] += len(group)
            verified[label] += sum(score_response(example, text) == (True, True) for text in group)
        for response in accepted(example, group, cfg, rank):
            kept.append(Example(example.task, example.prompt, example.answer, response, example.meta))
    if not kept:
        raise ValueError(f"rejection@{round_name}: no sampled response was accepted; nothing to train on")
    general_count = min(len(others), round(cfg.general_ratio * len(kept)))
    order = torch.randperm(len(others), generator=torch.Generator().manual_seed(params.seed)).tolist()
    general = [others[i] for i in sorted(order[:general_count])]

    stage = f"rejection@{round_name}"
    with atomic_output(stage_dir(stage)) as out, stage_live(stage) as live:
        out.mkdir()
        write_jsonl(out / "train.jsonl", kept + general)
        live.log_metric("accepted", len(kept), plot=False)
        live.log_metric("general", len(general), plot=False)
        if sampled:
            live.log_metric("acceptance_rate", round(sum(verified.values()) / sum(sampled.values()), 6), plot=False)
        for label in sorted(sampled):
            live.log_metric(
                f"acceptance_rate_by_difficulty/{label}", round(verified[label] / sampled[label], 6), plot=False
            )
    print(f"{stage}: kept {len(kept)} accepted responses + {len(general)} general rows", flush=True)
