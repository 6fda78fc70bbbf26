"""Rollout engines: turn prompts into sampled or greedy completions.

Stages talk to the ``RolloutEngine`` protocol, so the backend is a param: Hugging
Face ``generate`` (the default for small models and CPUs) or vLLM
(``tasks/vllm_engine.py``). An engine reports the log-probability it sampled each
token with, so a trainer can measure how far the engine's numbers drift from its own,
and takes the trainer's weights in place after each policy update.
"""

from dataclasses import dataclass
from typing import Protocol

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase


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
    token_ids: list[int]  # the generated tokens, up to and including end-of-sequence
    text: str  # decoded without special tokens
    logprobs: list[float]  # the engine's log-prob of each generated token (temperature applied)
    truncated: bool = False  # stopped at max_new_tokens without end-of-sequence


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], sampling: Sampling) -> list[Completion]:
        """Completions grouped by prompt: the n of prompt 0, then the n of prompt 1, ..."""
        ...

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Make the engine sample from ``model``'s current weights (in place, no reload from disk)."""
        ...


class HFEngine:
    """Batched ``model.generate`` with left padding; full-distribution sampling (no top-k/top-p)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size

    def sync_weights(self, model: PreTrainedModel) -> None:
        if model is not self.model:  # the trainer's own model needs nothing
            self.model.load_state_dict(model.state_dict())

    @torch.no_grad()
    def generate(self, prompts: list[str], sampling: Sampling) -> list[Completion]:
        config = GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not sampling.greedy,
            temperature=None if sampling.greedy else sampling.temperature,
            top_k=None if sampling.greedy else 0,
            top_p=None,
            num_return_sequences=sampling.n,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        temperature = 1.0 if sampling.greedy else sampling.temperature
        self.tokenizer.padding_side = "left"
        was_training = self.model.training
        self.model.eval()
        completions = []
        starts = range(0, len(prompts), self.batch_size)
        for start in tqdm(starts, desc="generate", leave=False, disable=len(starts) < 2):
            batch = self.tokenizer(prompts[start : start + self.batch_size], return_tensors="pt", padding=True)
            batch = batch.to(self.model.device)
            output = self.model.generate(**batch, generation_config=config)
            generated = output.sequences[:, batch["input_ids"].shape[1] :]
            # (B, T, V) raw logits of each step -> log-prob of the token that step produced
            logits = torch.stack(output.logits, dim=1).float() / temperature
            logprobs = torch.log_softmax(logits, -1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)
            for row, (token_ids, token_logprobs) in enumerate(zip(generated.tolist(), logprobs.tolist(), strict=True)):
                truncated = self.tokenizer.eos_token_id not in token_ids
                token_ids = _until_eos(token_ids, self.tokenizer.eos_token_id)
                text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
                completions.append(
                    Completion(start + row // sampling.n, token_ids, text, token_logprobs[: len(token_ids)], truncated)
                )
        self.model.train(was_training)
        return completions


def _until_eos(token_ids: list[int], eos_id: int) -> list[int]:
    return token_ids[: token_ids.index(eos_id) + 1] if eos_id in token_ids else token_ids
