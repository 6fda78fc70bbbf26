"""Stages `eval@<model>` and `agent_eval@<model>`: held-out greedy pass@1, sampled pass@k, format compliance,
response length and the share of greedy responses cut off at ``max_new_tokens`` (``truncated_rate``: a high one
explains a low pass@1); of an agent task, episodes with tools, and their turns, tool calls and tool errors.

``gold_reward`` is the gold judge's mean utility (``tasks/data/judge.py``, [0, 1]) of the sampled
responses: the policy's expected reward as RLHF optimises it, measured by the judge it never saw.
"""

import json
from pathlib import Path

import torch

from models import num_parameters
from tasks.algos.supervised import pass_at_k
from tasks.common.artifacts import EPISODES_FILE, atomic_output, stage_dir
from tasks.common.config import AgentConfig, EvalConfig, Params
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live
from tasks.common.training import make_deterministic
from tasks.data.datasets import read_examples
from tasks.data.environments import check_tool_tags, is_agent_task
from tasks.data.judge import gold_utility
from tasks.data.problems import Example, score_response, task_module, task_of
from tasks.rollout.engine import Completion, RolloutEngine, Sampling
from tasks.rollout.episodes import EPISODE_FIELDS, episode_limits, play
from tasks.rollout.hf_engine import policy_engine


def greedy_responses(
    engine: RolloutEngine, examples: list[Example], max_new_tokens: int
) -> tuple[list[Completion], torch.Tensor]:
    """The greedy completion of each example and its (formatted, correct) verdict, a row per example."""
    greedy = engine.generate([e.prompt for e in examples], Sampling(max_new_tokens, greedy=True))
    return greedy, torch.tensor([score_response(examples[c.prompt_index], c.text, c.env_reward) for c in greedy])


def graded(
    examples: list[Example], greedy: list[Completion], sampled: list[Completion], k: int
) -> tuple[dict[str, float], torch.Tensor]:
    """The held-out metrics of greedy completions and ``k`` sampled ones per prompt, whether single completions or
    episodes (graded on their final turns), and the greedy verdicts."""
    greedy_scores = torch.tensor([score_response(examples[c.prompt_index], c.text, c.env_reward) for c in greedy])
    gold = [gold_utility(examples[c.prompt_index], c.text, c.env_reward) for c in sampled]
    sampled_correct = torch.tensor([score_response(examples[c.prompt_index], c.text, c.env_reward)[1] for c in sampled])
    correct_per_prompt = sampled_correct.view(len(examples), k).sum(-1)
    metrics = {
        "pass@1": greedy_scores[:, 1].float().mean().item(),
        "pass@k": pass_at_k(k, correct_per_prompt, k).mean().item(),
        "sample_accuracy": sampled_correct.float().mean().item(),
        "gold_reward": sum(gold) / len(gold),
        "format_rate": greedy_scores[:, 0].float().mean().item(),
        "response_length": sum(c.model_tokens for c in greedy) / len(greedy),
        "truncated_rate": sum(c.truncated for c in greedy) / len(greedy),
    }
    return metrics, greedy_scores


def evaluate(
    engine: RolloutEngine, examples: list[Example], cfg: EvalConfig, agent: AgentConfig, max_total_tokens: int
) -> tuple[dict[str, float], list[dict]]:
    """Held-out metrics of the policy behind ``engine``, and its greedy episodes row by row: graded by ``score`` on
    their final turn; of a task with tools or an environment, episodes of up to ``agent.max_turns`` turns, with
    their turns, tool calls, tool errors and rewards (every turn and observation in the rows)."""
    module = task_module(task_of(examples))
    check_tool_tags(module, engine.tokenizer)
    greedy = play(engine, examples, module, Sampling(cfg.max_new_tokens, greedy=True), agent, max_total_tokens)
    sampling = Sampling(cfg.max_new_tokens, n=cfg.k, temperature=cfg.temperature)
    sampled = play(engine, examples, module, sampling, agent, max_total_tokens)
    metrics, greedy_scores = graded(
        examples, [e.completion() for e in greedy], [e.completion() for e in sampled], cfg.k
    )
    rows = [
        {"prompt": examples[e.prompt_index].prompt, "response": e.final_text, "formatted": bool(f), "correct": bool(ok)}
        for e, (f, ok) in zip(greedy, greedy_scores.tolist(), strict=True)
    ]
    if not is_agent_task(module):
        return metrics, rows
    for name in ("turns", "tool_calls", "tool_errors", "env_reward"):
        metrics[name] = sum(getattr(e, name) for e in greedy) / len(greedy)
    metrics["max_turns_rate"] = sum(e.hit_max_turns for e in greedy) / len(greedy)
    for row, episode in zip(rows, greedy, strict=True):
        row |= {name: getattr(episode, name) for name in EPISODE_FIELDS}
    return metrics, rows


def evaluate_model(
    model: Path, params: Params, data: Path, section: str = "eval"
) -> tuple[dict[str, float], list[dict]]:
    """``evaluate`` of the model directory ``model`` on the held-out split in ``data``, with the params ``section``
    of the evaluation (eval, agent_eval), seeded as the eval stage runs it: the retraining gate scores the champion
    through here, so it and the candidate's evaluation are the same measurement."""
    make_deterministic(params.seed)
    cfg = getattr(params, section)
    test_file = data / "test.jsonl"
    examples = read_examples(test_file)
    engine = policy_engine(params, model, {test_file: examples}, section, cfg.batch_size)
    return evaluate(engine, examples, cfg, *episode_limits(params, task_module(task_of(examples)), model))


def logged_metrics(model: Path, metrics: dict[str, float]) -> dict[str, float]:
    """What an evaluation stage logs of ``model``'s held-out ``metrics``: rounded, and its size beside them (what
    size buys). The retraining gate compares a champion it scores afresh with a candidate's logged metrics, so both
    are read through here."""
    return {name: round(value, 6) for name, value in metrics.items()} | {"num_parameters": num_parameters(model)}


def run(stage: StageRun) -> None:
    data = stage.inputs["data"]
    metrics, rows = evaluate_model(stage.inputs["model"], stage.params, data, stage.kind.section)
    with atomic_output(stage_dir(stage.name)) as out, stage_live(stage.name) as live:
        out.mkdir()
        # an agent task's greedy responses are episodes: every turn, tool call, observation and reward
        name = EPISODES_FILE if rows and "messages" in rows[0] else "greedy.jsonl"
        with open(out / name, "w") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
        for name, value in logged_metrics(stage.inputs["model"], metrics).items():
            live.log_metric(name, value, plot=False)
    print(f"{stage.name}: " + ", ".join(f"{name}={value:.3f}" for name, value in metrics.items()), flush=True)
