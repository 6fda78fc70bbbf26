"""Preference pairs as tensors: tokenised and length-checked, packed, and scored by a model's sequence log-probs.

A batch of P pairs packs as 2P rows, the chosen responses first, then the rejected, so a pair's two responses
share their prompt (computed once, ``shared_prompt_logits``). Responses end with end-of-sequence, as a model
finishes them.
"""

from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tasks.data.datasets import DatasetError, PreferencePair
from tasks.data.prompts import PromptFormat
from tasks.rl.preference_losses import PairLogprobs, sequence_logprobs
from tasks.rl.sequences import PackedBatch, pack, response_logprobs

TokenizedPair = tuple[list[int], list[int], list[int]]  # prompt, chosen, rejected token ids


def tokenize_pairs(
    pairs: list[PreferencePair],
    tokenizer: PreTrainedTokenizerBase,
    prompt_format: PromptFormat,
    source: str | Path,
    positions: int,
) -> list[TokenizedPair]:
    """Every pair's token ids, its prompt as ``prompt_format`` gives it to the model; DatasetError naming
    ``source:line`` for a pair longer than the model's ``positions``."""
    tokenized = []
    prompts = prompt_format.encode(tokenizer, [pair.prompt for pair in pairs])
    for line, (pair, prompt) in enumerate(zip(pairs, prompts, strict=True), start=1):
        chosen, rejected = (prompt_format.response_ids(tokenizer, text) for text in (pair.chosen, pair.rejected))
        longest = len(prompt) + max(len(chosen), len(rejected))
        if longest > positions:
            raise DatasetError(f"{source}:{line}: prompt + response is {longest} tokens, over the model's {positions}")
        tokenized.append((prompt, chosen, rejected))
    return tokenized


def pack_pairs(pairs: list[TokenizedPair], pad_id: int) -> PackedBatch:
    """2P rows: the P chosen responses, then the P rejected ones, each after its prompt."""
    prompts = [prompt for prompt, _, _ in pairs]
    return pack(prompts * 2, [chosen for _, chosen, _ in pairs] + [rejected for _, _, rejected in pairs], pad_id)


def pair_logprobs(
    model: PreTrainedModel, batch: PackedBatch, reference: tuple[torch.Tensor, torch.Tensor] | None = None
) -> PairLogprobs:
    """The policy's summed log-probs of a ``pack_pairs`` batch (with gradients when the model has them), beside the
    reference's (chosen, rejected) sums when given."""
    logprobs = response_logprobs(model, batch.to(model.device), temperature=1.0)
    sums, lengths = sequence_logprobs(logprobs, batch.response_mask.to(model.device))
    chosen, rejected = sums.chunk(2)
    chosen_tokens, rejected_tokens = lengths.chunk(2)
    ref_chosen, ref_rejected = reference if reference is not None else (None, None)
    return PairLogprobs(chosen, rejected, chosen_tokens, rejected_tokens, ref_chosen, ref_rejected)


@torch.no_grad()
def reference_logprobs(
    model: PreTrainedModel, pairs: list[TokenizedPair], pad_id: int, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (chosen, rejected) summed log-probs of every pair under a frozen ``model``: (P,), (P,)."""
    chosen, rejected = [], []
    for start in range(0, len(pairs), batch_size):
        scored = pair_logprobs(model, pack_pairs(pairs[start : start + batch_size], pad_id))
        chosen.append(scored.chosen.cpu())
        rejected.append(scored.rejected.cpu())
    return torch.cat(chosen), torch.cat(rejected)
