"""Rollout engines: turn prompts into sampled or greedy completions.

Stages talk to the ``RolloutEngine`` protocol, so the backend is a param: Hugging
Face ``generate`` here (the default for small models and CPUs); vLLM plugs in
behind the same interface.
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


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], sampling: Sampling) -> list[Completion]:
        """Completions grouped by prompt: the n of prompt 0, then the n of prompt 1, ..."""
        ...


class HFEngine:
    """Batched ``model.generate`` with left padding; full-distribution sampling (no top-k/top-p)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size

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
        )
        self.tokenizer.padding_side = "left"
        was_training = self.model.training
        self.model.eval()
        completions = []
        starts = range(0, len(prompts), self.batch_size)
        for start in tqdm(starts, desc="generate", leave=False, disable=len(starts) < 2):
            batch = self.tokenizer(prompts[start : start + self.batch_size], return_tensors="pt", padding=True)
            batch = batch.to(self.model.device)
            output = self.model.generate(**batch, generation_config=config)
            generated = output[:, batch["input_ids"].shape[1] :].tolist()
            for row, token_ids in enumerate(generated):
                token_ids = _until_eos(token_ids, self.tokenizer.eos_token_id)
                text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
                completions.append(Completion(start + row // sampling.n, token_ids, text))
        self.model.train(was_training)
        return completions


def _until_eos(token_ids: list[int], eos_id: int) -> list[int]:
    return token_ids[: token_ids.index(eos_id) + 1] if eos_id in token_ids else token_ids
