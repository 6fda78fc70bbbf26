"""The rollout interface every stage samples through: how to decode, what comes back, and the engine protocol.

Stages talk to ``RolloutEngine``, so the backend is a param: a sampling loop over a Hugging
Face model (``hf_engine.py``, the default for small models and CPUs) or vLLM
(``vllm_engine.py``). An engine reports the log-probability it sampled each token with, so
a trainer can measure how far the engine's numbers drift from its own, and takes the
trainer's weights in place after each policy update.
"""

from dataclasses import dataclass, replace
from typing import Any, Protocol

from transformers import PreTrainedModel

from tasks.data.prompts import PromptFormat


@dataclass(frozen=True)
class Sampling:
    """How to decode: ``greedy`` ignores ``temperature``; ``n`` completions per prompt."""

    max_new_tokens: int
    n: int = 1
    greedy: bool = False
    temperature: float = 1.0


@dataclass(frozen=True)
class EpisodeStats:
    """What happened in a multi-turn episode (``tasks/rollout/episodes.py``), as the RL trainer logs and writes it."""

    turns: int
    tool_calls: int
    tool_errors: int
    hit_max_turns: bool
    env_reward: float  # the sum of the environment's rewards
    messages: list[dict[str, Any]]  # every turn's role and content (an observation's reward too), for display


@dataclass(frozen=True)
class Completion:
    """A sampled response, or a multi-turn episode as one: its opening prompt, then every model turn and
    observation after it (``mask`` telling the model's tokens from the observations'), graded on its final turn."""

    prompt_index: int
    prompt_ids: list[int]  # the prompt as the engine read it (through the chat template, when there is one)
    token_ids: list[int]  # the generated tokens, up to and including the stop token (end-of-sequence or of turn)
    text: str  # decoded without special tokens; an episode's final model turn
    logprobs: list[float]  # the engine's log-prob of each generated token (temperature applied); 0.0 on observations
    truncated: bool = False  # stopped at max_new_tokens without a stop token (an episode: or at its token budget)
    engine: int = 0  # the rollout engine replica that sampled it
    mask: list[int] | None = None  # 1 on the model's own tokens of token_ids, 0 on observations; None: all the model's
    episode: EpisodeStats | None = None  # None: a single completion

    @property
    def model_tokens(self) -> int:
        """The tokens the model sampled: an episode's turns without its observations."""
        return len(self.token_ids) if self.mask is None else sum(self.mask)

    @property
    def env_reward(self) -> float | None:
        """An episode's environment reward, which a task grading episodes scores it with; None for a completion."""
        return None if self.episode is None else self.episode.env_reward


def opened_responses(prompt_format: PromptFormat, completions: list[Completion]) -> list[Completion]:
    """``completions`` of prompts ``prompt_format`` encoded, each text with the response prefix the prompt ended
    with in front: the whole response, as verifiers and judges read it."""
    if not prompt_format.response_prefix:
        return completions
    return [replace(c, text=prompt_format.response_text(c.text)) for c in completions]


def truncated_rate(completions: list[Completion]) -> float:
    """The share of ``completions`` cut off at ``max_new_tokens`` before their stop token."""
    return sum(c.truncated for c in completions) / len(completions)


class RolloutEngine(Protocol):
    tokenizer: Any
    prompt_format: PromptFormat  # how ``generate`` turns a prompt into ids
    stop_ids: list[int]  # the tokens that end a response

    def generate(self, prompts: list[str], sampling: Sampling) -> list[Completion]:
        """Completions grouped by prompt: the n of prompt 0, then the n of prompt 1, ...; each text opens with
        ``prompt_format``'s response prefix (``opened_responses``)."""
        ...

    def generate_ids(self, prompt_ids: list[list[int]], sampling: Sampling) -> list[Completion]:
        """``generate`` continuing each context of token ids as it is (no template, nothing added): a multi-turn
        episode's next turn after the ids it has so far. ``generate`` is this after ``prompt_format``'s encoding."""
        ...

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Make the engine sample from ``model``'s current weights (in place, no reload from disk)."""
        ...
