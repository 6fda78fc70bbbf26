"""Stage `eval@<model>`: held-out greedy pass@1, sampled pass@k, format compliance, response length and the share
of greedy responses cut off at ``eval.max_new_tokens`` (``truncated_rate``: a high one explains a low pass@1).

``gold_reward`` is the gold judge's mean utility (``tasks/data/judge.py``, [0, 1]) of the sampled
responses: the policy's expected reward as RLHF optimises it, measured by the judge it never saw.
"""

import json
from pathlib import Path

import torch

from models import num_parameters
from tasks.common.artifacts import DATA_DIR, atomic_output, stage_dir
from tasks.common.config import EvalConfig, Params
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live
from tasks.common.training import make_deterministic
from tasks.data.datasets import read_examples
from tasks.data.judge import gold_utility
from tasks.data.problems import Example, score_response
from tasks.rl.core_algos import pass_at_k
from tasks.rollout.engine import Completion, RolloutEngine, Sampling, truncated_rate
from tasks.rollout.hf_engine import policy_engine


def greedy_responses(
    engine: RolloutEngine, examples: list[Example], max_new_tokens: int
) -> tuple[list[Completion], torch.Tensor]:
    """The greedy completion of each example and its (formatted, correct) verdict, a row per example."""
    greedy = engine.generate([e.prompt for e in examples], Sampling(max_new_tokens, greedy=True))
    return greedy, torch.tensor([score_response(examples[c.prompt_index], c.text) for c in greedy])


def evaluate(engine: RolloutEngine, examples: list[Example], cfg: EvalConfig) -> tuple[dict[str, float], list[dict]]:
    """Held-out metrics of the policy behind ``engine``, and its greedy responses row by row."""
    prompts = [e.prompt for e in examples]
    greedy, greedy_scores = greedy_responses(engine, examples, cfg.max_new_tokens)
    sampled = engine.generate(prompts, Sampling(cfg.max_new_tokens, n=cfg.k, temperature=cfg.temperature))
    gold = [gold_utility(examples[c.prompt_index], c.text) for c in sampled]
    sampled_correct = torch.tensor([score_response(examples[c.prompt_index], c.text)[1] for c in sampled])
    correct_per_prompt = sampled_correct.view(len(prompts), cfg.k).sum(-1)
    metrics = {
        "pass@1": greedy_scores[:, 1].float().mean().item(),
        "pass@k": pass_at_k(cfg.k, correct_per_prompt, cfg.k).mean().item(),
        "sample_accuracy": sampled_correct.float().mean().item(),
        "gold_reward": sum(gold) / len(gold),
        "format_rate": greedy_scores[:, 0].float().mean().item(),
        "response_length": sum(len(c.token_ids) for c in greedy) / len(greedy),
        "truncated_rate": truncated_rate(greedy),
    }
    rows = [
        {"prompt": prompts[c.prompt_index], "response": c.text, "formatted": bool(f), "correct": bool(ok)}
        for c, (f, ok) in zip(greedy, greedy_scores.tolist(), strict=True)
    ]
    return metrics, rows


def evaluate_model(model: Path, params: Params, data: Path = DATA_DIR) -> tuple[dict[str, float], list[dict]]:
    """``evaluate`` of the model directory ``model`` on the held-out split, seeded as the eval stage runs it: the
    retraining gate scores the champion through here, so it and the candidate's eval@ are the same measurement."""
    make_deterministic(params.seed)
    test_file = data / "test.jsonl"
    examples = read_examples(test_file)
    new_tokens = ("eval.max_new_tokens", params.eval.max_new_tokens)
    engine = policy_engine(params, model, {test_file: examples}, new_tokens)
    return evaluate(engine, examples, params.eval)


def run(stage: StageRun) -> None:
    metrics, rows = evaluate_model(stage.inputs["model"], stage.params, stage.inputs["data"])
    with atomic_output(stage_dir(stage.name)) as out, stage_live(stage.name) as live:
        out.mkdir()
        with open(out / "greedy.jsonl", "w") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
        for name, value in metrics.items():
            live.log_metric(name, round(value, 6), plot=False)
        # beside pass@1: what size buys
        live.log_metric("num_parameters", num_parameters(stage.inputs["model"]), plot=False)
    print(f"{stage.name}: " + ", ".join(f"{name}={value:.3f}" for name, value in metrics.items()), flush=True)
