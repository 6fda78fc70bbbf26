"""The rollout interface every stage samples through: how to decode, what comes back, and the engine protocol.

Stages talk to ``RolloutEngine``, so the backend is a param: a sampling loop over a Hugging
Face model (``hf_engine.py``, the default for small models and CPUs) or vLLM
(``vllm_engine.py``). An engine reports the log-probability it sampled each token with, so
a trainer can measure how far the engine's numbers drift from its own, and takes the
trainer's weights in place after each policy update.
"""

from dataclasses import dataclass
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
class Completion:
    prompt_index: int
    prompt_ids: list[int]  # the prompt as the engine read it (through the chat template, when there is one)
    token_ids: list[int]  # the generated tokens, up to and including the stop token (end-of-sequence or of turn)
    text: str  # decoded without special tokens
    logprobs: list[float]  # the engine's log-prob of each generated token (temperature applied)
    truncated: bool = False  # stopped at max_new_tokens without a stop token
    engine: int = 0  # the rollout engine replica that sampled it


def truncated_rate(completions: list[Completion]) -> float:
    """The share of ``completions`` cut off at ``max_new_tokens`` before their stop token."""
    return sum(c.truncated for c in completions) / len(completions)


class RolloutEngine(Protocol):
    tokenizer: Any
    prompt_format: PromptFormat  # how ``generate`` turns a prompt into ids
    stop_ids: list[int]  # the tokens that end a response

    def generate(self, prompts: list[str], sampling: Sampling) -> list[Completion]:
        """Completions grouped by prompt: the n of prompt 0, then the n of prompt 1, ..."""
        ...

    def generate_ids(self, prompt_ids: list[list[int]], sampling: Sampling) -> list[Completion]:
        """``generate`` continuing each context of token ids as it is (no template, nothing added): a multi-turn
        episode's next turn after the ids it has so far. ``generate`` is this after ``prompt_format``'s encoding."""
        ...

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Make the engine sample from ``model``'s current weights (in place, no reload from disk)."""
        ...
