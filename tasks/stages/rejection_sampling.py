"""Rejection sampling: N responses per prompt from a policy, kept when the task's verifier accepts them.

R1's ``rejection@<round>`` (the data of its second SFT) and distillation's ``teacher_data``
(DeepSeek-R1-Distill's data: the teacher's verified responses) both run it. For a task with tools or an
environment a response is an episode, graded on its final turn; an accepted one keeps its turns as the row's
worked trace (``meta["turns"]``), which the next SFT trains on. The kept responses are
distinct, at most ``max_per_prompt`` a prompt, in sampling order; the statistics are the acceptance rate
overall and by difficulty (for arithmetic, by operation).
"""

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from tasks.common.config import Params, RejectionSamplingConfig
from tasks.data.environments import check_tool_tags, is_agent_task
from tasks.data.problems import Example, difficulty_label, has_verifier, score_response, task_module
from tasks.rollout.engine import RolloutEngine, Sampling
from tasks.rollout.episodes import episode_limits, play, trace
from tasks.rollout.hf_engine import policy_engine

# Scores of (example, its distinct responses), higher is better: how a task without a verifier picks.
Ranker = Callable[[Example, list[str]], list[float]]


def accepted(
    example: Example,
    responses: list[str],
    max_per_prompt: int,
    rank: Ranker | None = None,
    top_by_rank: int = 1,
    env_rewards: list[float | None] | None = None,
) -> list[str]:
    """The responses to keep for one prompt: verified ones (or the ``top_by_rank`` best by ``rank`` for a task
    without a verifier), distinct, at most ``max_per_prompt``, in sampling order. ``env_rewards``: each response's
    episode reward, for a task that grades episodes (a response is judged with the first episode that ended in it)."""
    first: dict[str, float | None] = {}
    for response, env_reward in zip(responses, env_rewards or [None] * len(responses), strict=True):
        if response.strip():
            first.setdefault(response, env_reward)
    distinct = list(first)
    if has_verifier(example):
        return [r for r in distinct if score_response(example, r, first[r]) == (True, True)][:max_per_prompt]
    if rank is None:
        raise ValueError(f"task {example.task!r} has no verifier, and nothing ranks its responses")
    scores = rank(example, distinct)
    best = sorted(range(len(distinct)), key=lambda i: -scores[i])[: min(top_by_rank, max_per_prompt)]
    return [distinct[i] for i in sorted(best)]


def _sampled(
    params: Params, engine: RolloutEngine, policy: Path, prompts: list[Example], sampling: Sampling
) -> list[tuple[str, list[dict[str, str]] | None, float | None]]:
    """Each sampled response, grouped by prompt: its text (an episode's final turn, for a task with tools or an
    environment) and, for an episode, the turns that led to it and its environment reward."""
    module = task_module(prompts[0].task)
    check_tool_tags(module, engine.tokenizer)
    episodes = play(engine, prompts, module, sampling, *episode_limits(params, module, policy))
    if not is_agent_task(module):
        return [(e.final_text, None, None) for e in episodes]
    return [(e.final_text, trace(e, engine, prompts[e.prompt_index].prompt), e.env_reward) for e in episodes]


def sample_and_verify(
    params: Params,
    cfg: RejectionSamplingConfig,
    section: str,
    policy: Path,
    prompts: list[Example],
    source: Path,
    rank: Ranker | None = None,
    top_by_rank: int = 1,
) -> tuple[list[Example], dict[str, float]]:
    """Sample ``cfg.samples_per_prompt`` responses to each of ``prompts`` (read from ``source``) from ``policy`` and
    keep the accepted ones as SFT rows; returns them and the statistics (``accepted``, ``acceptance_rate``,
    ``acceptance_rate_by_difficulty/<label>``). ``section`` names cfg's keys in errors."""
    engine = policy_engine(params, policy, {source: prompts}, section)
    sampling = Sampling(cfg.max_new_tokens, n=cfg.samples_per_prompt, temperature=cfg.temperature)
    responses = _sampled(params, engine, policy, prompts, sampling)

    kept: list[Example] = []
    sampled, verified = defaultdict(int), defaultdict(int)
    for index, example in enumerate(prompts):
        sampled_here = responses[index * cfg.samples_per_prompt : (index + 1) * cfg.samples_per_prompt]
        group, env_rewards, traces = [text for text, *_ in sampled_here], [env for *_, env in sampled_here], {}
        for text, turns, _ in sampled_here:
            traces.setdefault(text, turns)  # the first episode that ended in this response
        if has_verifier(example):
            label = difficulty_label(example)
            sampled[label] += len(group)
            verified[label] += sum(score_response(example, t, env) == (True, True) for t, _, env in sampled_here)
        for response in accepted(example, group, cfg.max_per_prompt, rank, top_by_rank, env_rewards):
            # an accepted episode's turns become the next SFT's worked trace
            meta = example.meta if traces[response] is None else {**example.meta, "turns": traces[response]}
            kept.append(Example(example.task, example.prompt, example.answer, response, meta))
    statistics = {"accepted": float(len(kept))}
    if sampled:
        statistics["acceptance_rate"] = round(sum(verified.values()) / sum(sampled.values()), 6)
    for label in sorted(sampled):
        statistics[f"acceptance_rate_by_difficulty/{label}"] = round(verified[label] / sampled[label], 6)
    return kept, statistics
