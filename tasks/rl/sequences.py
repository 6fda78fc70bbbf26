"""Prompt + response token lists packed into one padded batch, the layout every role computes on.

Prompts are left-padded to a common width P and responses right-padded to a common
width T, so response token t of every row sits at column P + t and the logits that
predict it at column P + t − 1. Position ids count real tokens only, which makes a
row's numbers independent of how much padding its batch needed (and equal to what
``generate`` computed for it).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from tasks.algos.tokens import token_logprobs
from tasks.common.distributed import is_sharded
from tasks.data.prompts import PromptFormat


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (B, P + T)
    attention_mask: torch.Tensor  # (B, P + T)
    position_ids: torch.Tensor  # (B, P + T)
    response_mask: torch.Tensor  # (B, T) float, 1.0 on the model's own response tokens (not padding, observations)
    prompt_width: int  # P

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "position_ids": self.position_ids}

    def response_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, T, ·): the outputs at the positions that predict (or value the state before) each response token."""
        width = self.response_mask.shape[1]
        return logits[:, self.prompt_width - 1 : self.prompt_width - 1 + width]

    @property
    def response_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_width :]

    def to(self, device: torch.device) -> "PackedBatch":
        moved = {name: getattr(self, name).to(device) for name in ("input_ids", "attention_mask", "position_ids")}
        return PackedBatch(**moved, response_mask=self.response_mask.to(device), prompt_width=self.prompt_width)

    def select(self, rows: torch.Tensor) -> "PackedBatch":
        return PackedBatch(
            self.input_ids[rows],
            self.attention_mask[rows],
            self.position_ids[rows],
            self.response_mask[rows],
            self.prompt_width,
        )


# Rows run in this many groups of similar response length, each padded only to its own longest response:
# on the default task a batch's longest response is a third longer than its mean (28 of 38 tokens are real).
RESPONSE_BUCKETS = 4


def shared_prompt_logits(
    model: PreTrainedModel, batch: PackedBatch, kept: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """(B, T, V): ``model``'s logits predicting each response token, each distinct prompt computed once; or, with
    ``kept``, what ``kept(logits, rows)`` keeps of each group of rows' (b, T, V) logits (their log-probs, say), so
    that the grouped pass below never holds the whole batch's logits at once (one pass over every row holds them
    as the model returns them).

    Responses that share a prompt (a GRPO group, a preference pair) share its forward pass: it runs once,
    its KV cache is gathered for each of its rows (gradients flow back through the gather) and only the
    responses run per row, in ``RESPONSE_BUCKETS`` groups of similar length, each padded to its own
    longest. The same numbers as one forward pass over every row (up to float rounding), for about a third
    less compute at G = 8 on the default task, whose prompts are 40% of a row's tokens. Without a shared
    prompt (or with gradient checkpointing, which drops the cache) it is that pass; the logits past a row's
    response are zeros.
    """
    kept = kept or (lambda logits, rows: logits)
    width = batch.prompt_width
    prompt_columns = torch.cat([batch.input_ids[:, :width], batch.attention_mask[:, :width]], -1)
    distinct, prompt_of_row = torch.unique(prompt_columns, dim=0, return_inverse=True)
    rows = torch.arange(len(prompt_of_row), device=prompt_of_row.device)
    # Gradient checkpointing drops the KV cache from a training forward pass; the ranks of a sharded model gather
    # its parameters at each pass, in lockstep, so they must run the same passes whatever their rows.
    if len(distinct) == len(prompt_of_row) or (model.training and model.is_gradient_checkpointing) or is_sharded(model):
        return kept(batch.response_logits(model(**batch.model_inputs()).logits), rows)
    first_row = torch.full((len(distinct),), len(rows), device=rows.device)
    first_row = first_row.scatter_reduce(0, prompt_of_row, rows, reduce="amin")
    prompts = DynamicCache(config=model.config)
    last_prompt_logits = model(
        input_ids=batch.input_ids[first_row, :width],
        attention_mask=batch.attention_mask[first_row, :width],
        position_ids=batch.position_ids[first_row, :width],
        past_key_values=prompts,
        use_cache=True,
        logits_to_keep=1,
    ).logits
    # each row's whole response, observations included (the response mask leaves an episode's out)
    lengths = batch.attention_mask[:, width:].sum(-1).clamp(min=1)
    order = torch.argsort(lengths, stable=True)
    parts = []
    for bucket in order.tensor_split(RESPONSE_BUCKETS):
        if len(bucket) == 0:
            continue
        longest = int(lengths[bucket].max())
        cache = DynamicCache(config=model.config)
        for index, layer in enumerate(prompts.layers):
            cache.update(layer.keys[prompt_of_row[bucket]], layer.values[prompt_of_row[bucket]], index)
        logits = model(
            input_ids=batch.input_ids[bucket, width : width + longest],
            attention_mask=batch.attention_mask[bucket, : width + longest],
            position_ids=batch.position_ids[bucket, width : width + longest],
            past_key_values=cache,
            use_cache=True,
        ).logits
        # the last prompt position predicts response token 0; response position t predicts token t + 1
        logits = torch.cat([last_prompt_logits[prompt_of_row[bucket]], logits[:, :-1]], dim=1)
        parts.append(kept(torch.nn.functional.pad(logits, (0, 0, 0, batch.response_mask.shape[1] - longest)), bucket))
    return torch.cat(parts)[torch.argsort(order)]


def response_logprobs(model: PreTrainedModel, batch: PackedBatch, temperature: float) -> torch.Tensor:
    """(B, T): the log-probs of the response tokens under ``model`` at ``temperature``, computed group by group of
    rows: the bits of ``response_logprobs_and_logits``'s, without holding the batch's logits at once."""

    def logprobs(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return token_logprobs(logits.float() / temperature, batch.response_ids[rows])

    return shared_prompt_logits(model, batch, logprobs)


def response_logprobs_and_logits(
    model: PreTrainedModel, batch: PackedBatch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs of the response tokens, their logits) under ``model`` at ``temperature``: (B, T), (B, T, V)."""
    logits = shared_prompt_logits(model, batch).float() / temperature
    return token_logprobs(logits, batch.response_ids), logits


def pack(
    prompts: list[list[int]], responses: list[list[int]], pad_id: int, masks: list[list[int] | None] | None = None
) -> PackedBatch:
    """``responses`` right-padded after their left-padded ``prompts``; each row's response mask is its ``masks``
    entry (an episode's: 0 on observations) where it has one, else 1 on every response token."""
    masks = masks or [None] * len(responses)
    prompt_width = max(len(p) for p in prompts)
    response_width = max(1, max(len(r) for r in responses))
    rows = len(prompts)
    input_ids = torch.full((rows, prompt_width + response_width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros((rows, response_width))
    for row, (prompt, response, mask) in enumerate(zip(prompts, responses, masks, strict=True)):
        start = prompt_width - len(prompt)
        input_ids[row, start : prompt_width + len(response)] = torch.tensor(prompt + response)
        attention_mask[row, start : prompt_width + len(response)] = 1
        response_mask[row, : len(response)] = 1.0 if mask is None else torch.tensor(mask, dtype=response_mask.dtype)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return PackedBatch(input_ids, attention_mask, position_ids, response_mask, prompt_width)


def pack_text(
    tokenizer: PreTrainedTokenizerBase, prompt_format: PromptFormat, prompts: list[str], responses: list[str]
) -> PackedBatch:
    """Tokenise (prompt, response) texts as a finished response (it ends with end-of-sequence), each prompt as
    ``prompt_format`` gives it to the model."""
    response_ids = [prompt_format.response_ids(tokenizer, r) for r in responses]
    return pack(prompt_format.encode(tokenizer, prompts), response_ids, tokenizer.pad_token_id)
