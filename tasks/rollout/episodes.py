"""Multi-turn episodes, token-exact: the model's turns, tool calls and observations as one sequence of ids.

Nothing the model sampled is decoded and encoded again between turns: its ids are appended as they came (a BPE
tokenizer need not give them back from their text: a merge across the turn's end, or sampled ids that are not the
canonical encoding of their text, would change what the trainer scores). Only an observation's text is encoded,
as the chat template's tool turn followed by the next assistant turn's header, or, for a model without a template,
as ``"\\n<tool_response>" + text + "</tool_response>\\n"``. A task without tools or an environment is the
one-turn case, through the same path: one round, the completion the engine gives, no process started for it
(its turn reports nothing an episode would: ``Episode.interactive``).
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from models import context_length
from tasks.common.config import AgentConfig, Params
from tasks.data.environments import EnvironmentHost, HostedEnvironment, is_agent_task
from tasks.data.observations import ObservationFormat
from tasks.data.problems import Example, TaskError
from tasks.data.prompts import PromptFormat
from tasks.rollout.engine import Completion, EpisodeStats, RolloutEngine, Sampling


@dataclass(frozen=True)
class Episode:
    """One episode of a prompt: the whole sequence (prompt, then each model turn and each observation) and what
    happened in it. ``mask`` is 1 on the model's own sampled tokens (what a trainer learns from), 0 elsewhere;
    ``logprobs`` the engine's log-prob of each model token, 0.0 elsewhere; both as long as ``token_ids``."""

    prompt_index: int
    prompt_length: int  # the opening prompt's ids, the first of ``token_ids``
    token_ids: list[int]
    mask: list[int]
    logprobs: list[float]
    turns: int
    tool_calls: int
    tool_errors: int
    truncated: bool  # a model turn hit max_new_tokens, or the episode's token budget ran out
    hit_max_turns: bool  # the environment wanted another turn after the last one allowed
    env_reward: float  # the sum of the environment's rewards
    final_text: str  # the last model turn, decoded: what ``score`` grades
    messages: list[dict[str, Any]]  # every turn's role and content (an observation's reward too), for display
    interactive: bool = True  # the task has tools or an environment; False: a single-turn task's one turn

    def completion(self) -> Completion:
        """The episode as a rollout's completion: its opening prompt, then every turn and observation after it (a
        single-turn task's: the engine's completion as it came, with no turns to report)."""
        start = self.prompt_length
        if not self.interactive:
            ids, logprobs = self.token_ids[start:], self.logprobs[start:]
            return Completion(self.prompt_index, self.token_ids[:start], ids, self.final_text, logprobs, self.truncated)
        stats = EpisodeStats(
            self.turns, self.tool_calls, self.tool_errors, self.hit_max_turns, self.env_reward, self.messages
        )
        return Completion(
            self.prompt_index,
            self.token_ids[:start],
            self.token_ids[start:],
            self.final_text,
            self.logprobs[start:],
            self.truncated,
            mask=self.mask[start:],
            episode=stats,
        )


# What an episode's row in eval's EPISODES_FILE holds besides its prompt and graded final turn.
EPISODE_FIELDS = ("turns", "tool_calls", "tool_errors", "truncated", "hit_max_turns", "env_reward", "messages")


@dataclass
class _Running:
    """An episode being played."""

    prompt_index: int
    environment: HostedEnvironment
    prompt_length: int = 0
    token_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    env_reward: float = 0.0
    final_text: str = ""
    done: bool = False
    truncated: bool = False
    hit_max_turns: bool = False

    def extend(self, ids: list[int], logprobs: list[float] | None = None) -> None:
        self.token_ids += ids
        self.mask += [0 if logprobs is None else 1] * len(ids)
        self.logprobs += [0.0] * len(ids) if logprobs is None else logprobs

    def episode(self, interactive: bool) -> Episode:
        env = self.environment
        return Episode(
            self.prompt_index,
            self.prompt_length,
            self.token_ids,
            self.mask,
            self.logprobs,
            self.turns,
            env.tool_calls,
            env.tool_errors,
            self.truncated,
            self.hit_max_turns,
            self.env_reward,
            self.final_text,
            self.messages,
            interactive,
        )


def run_episodes(
    engine: RolloutEngine,
    examples: list[Example],
    task_module: ModuleType,
    sampling: Sampling,
    max_turns: int,
    max_total_tokens: int,
    tool_timeout_seconds: float = 10.0,
    tool_output_chars: int = 10_000,
) -> list[Episode]:
    """``sampling.n`` episodes of each example, grouped by example as completions are, of at most ``max_turns``
    model turns and ``max_total_tokens`` tokens in all (prompt included). Each round samples the next turn of every
    episode still in play in one engine call (the first round: each prompt's n samples, as ``generate`` does)."""
    # made at the first observation: a single-turn task's model need not render tool turns
    observations = functools.cache(
        lambda: ObservationFormat(
            engine.tokenizer, engine.prompt_format.uses_template(engine.tokenizer), engine.stop_ids
        )
    )
    n, interactive = sampling.n, is_agent_task(task_module)
    with EnvironmentHost(task_module, tool_timeout_seconds, tool_output_chars) as host:
        runs = [_Running(i // n, host.environment(i)) for i in range(len(examples) * n)]
        prompts = _opened_prompts(examples, [run.environment.reset(examples[run.prompt_index]) for run in runs], n)
        # a response prefix opens a single-turn task's response; an agent's episode opens its turns itself
        prompt_format = engine.prompt_format.multi_turn() if interactive else engine.prompt_format
        prompt_ids = prompt_format.encode(engine.tokenizer, prompts)
        if (longest := max(map(len, prompt_ids), default=0)) >= max_total_tokens:
            raise TaskError(
                f"agent.max_total_tokens: an episode of at most {max_total_tokens} tokens (the model's context length "
                f"when unset) leaves no room for a turn after the longest prompt ({longest} tokens, its opening "
                f"observation included); above {longest}"
            )
        for run in runs:
            run.extend(prompt_ids[run.prompt_index])
            run.prompt_length = len(run.token_ids)
            run.messages = engine.prompt_format.messages(prompts[run.prompt_index])
        for turn in range(1, max_turns + 1):
            for run in runs:
                if not run.done and len(run.token_ids) >= max_total_tokens:
                    run.done = run.truncated = True
            live = [run for run in runs if not run.done]
            if not live:
                break
            # One call for every episode: sampled to the largest budget left, each turn then cut to its own.
            limit = min(sampling.max_new_tokens, max(max_total_tokens - len(run.token_ids) for run in live))
            if turn == 1 and len(live) == len(runs):
                completions = engine.generate_ids(prompt_ids, replace(sampling, max_new_tokens=limit))
            else:
                contexts = [run.token_ids for run in live]
                completions = engine.generate_ids(contexts, replace(sampling, n=1, max_new_tokens=limit))
            for run, completion in zip(live, completions, strict=True):
                _play(run, completion, engine, prompt_format, observations, turn == max_turns, max_total_tokens)
    if runs and all(run.environment.failure for run in runs):
        failures = list(dict.fromkeys(run.environment.failure for run in runs))
        raise TaskError(
            f"every one of {len(runs)} episodes failed on {task_module.__name__}.environment(): "
            + "; ".join(failures[:3])
        )
    return [run.episode(interactive) for run in runs]


def _opened_prompts(examples: list[Example], openings: list[str | None], n: int) -> list[str]:
    """Each example's prompt, its environment's opening observation joined to it; TaskError when the ``n``
    environments of one example open differently (they share the prompt, so its n samples share its prefill)."""
    prompts = []
    for index, example in enumerate(examples):
        opening = set(openings[index * n : (index + 1) * n])
        if len(opening) > 1:
            raise TaskError(
                f"{example.task}.environment().reset() opened one example's episodes differently: {sorted(opening)}"
            )
        (text,) = opening
        prompts.append(example.prompt if text is None else f"{example.prompt}\n\n{text}")
    return prompts


def _play(
    run: _Running,
    completion: Completion,
    engine: RolloutEngine,
    prompt_format: PromptFormat,
    observations: Callable[[], ObservationFormat],
    last_turn: bool,
    max_total_tokens: int,
) -> None:
    """One model turn of ``run``: its sampled ids appended as they came, then the environment's answer. The turn's
    text opens with ``prompt_format``'s response prefix, which the prompt ended with."""
    budget = max_total_tokens - len(run.token_ids)
    ids, logprobs, text = completion.token_ids, completion.logprobs, completion.text
    if len(ids) > budget:
        ids, logprobs = ids[:budget], logprobs[:budget]
        text = engine.tokenizer.decode(ids, skip_special_tokens=True)
    text = prompt_format.response_text(text)
    run.extend(ids, logprobs)
    run.turns += 1
    run.final_text = text
    run.messages.append({"role": "assistant", "content": text})
    if completion.truncated or len(completion.token_ids) > budget:
        run.done = run.truncated = True
        return
    step = run.environment.step(text)
    run.env_reward += step.reward
    if step.observation is not None:
        run.messages.append({"role": "tool", "content": step.observation, "reward": step.reward})
    if step.done:
        run.done = True
        return
    if last_turn:
        run.done = run.hit_max_turns = True
        return
    observed = observations().encode(step.observation or "")
    if len(run.token_ids) + len(observed) >= max_total_tokens:  # no room left for the model's next turn
        run.done = run.truncated = True
        return
    run.extend(observed)


def episode_tensors(episodes: list[Episode], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, loss mask), each (B, T) right-padded: the loss mask is the episodes' ``mask``
    (the targets a trainer learns from: the model's own tokens, never an observation's), as ``sft_loss`` takes it."""
    width = max(len(e.token_ids) for e in episodes)
    input_ids = torch.full((len(episodes), width), pad_id, dtype=torch.long)
    attention_mask, loss_mask = torch.zeros_like(input_ids), torch.zeros_like(input_ids)
    for row, episode in enumerate(episodes):
        length = len(episode.token_ids)
        input_ids[row, :length] = torch.tensor(episode.token_ids)
        attention_mask[row, :length] = 1
        loss_mask[row, :length] = torch.tensor(episode.mask)
    return input_ids, attention_mask, loss_mask


def play(
    engine: RolloutEngine,
    examples: list[Example],
    task_module: ModuleType,
    sampling: Sampling,
    agent: AgentConfig,
    max_total_tokens: int,
) -> list[Episode]:
    """``run_episodes`` within ``agent``'s limits (params.agent): how every stage that samples from a task's prompts
    to grade them plays them, a task with tools or an environment or not. The stage checks once, before its first
    episode, that the engine's tokenizer writes the tool-call tags (``check_tool_tags``)."""
    limits = (agent.max_turns, max_total_tokens, agent.tool_timeout_seconds, agent.tool_output_chars)
    return run_episodes(engine, examples, task_module, sampling, *limits)


def episode_limits(params: Params, task_module: ModuleType, model_dir: Path) -> tuple[AgentConfig, int]:
    """(the agent limits, the token budget) of episodes of ``task_module``'s task played by the model in
    ``model_dir``: ``params.agent``'s for a task with tools or an environment; a single-turn task's one turn is
    bounded by the model's context length alone (and its stage does not read ``agent``)."""
    if not is_agent_task(task_module):
        return AgentConfig(), context_length(model_dir)
    return params.agent, params.agent.max_total_tokens or context_length(model_dir)


def trace(episode: Episode, engine: RolloutEngine, prompt: str) -> list[dict[str, str]]:
    """The episode's turns after its prompt as a worked trace (``meta["turns"]``: what SFT trains on)."""
    opening = len(engine.prompt_format.messages(prompt))
    return [{"role": m["role"], "content": m["content"]} for m in episode.messages[opening:]]
