"""The HF engine's decoding step (``tasks/rollout/hf_engine.py``), eager or compiled.

Both take a batch whose prompts were prefilled into a ``DynamicCache`` and step it one token at a time; the engine
tells them which rows are still sampling (``keep``) and feeds them those rows' last tokens (``step``).

- ``EagerDecoder``: transformers' ``DynamicCache``, which grows by concatenation, and the model's forward as it is;
  a row leaves the batch at its end (the work shrinks as rows end).
- ``CompiledDecoder``: a preallocated ``StaticCache`` per batch bucket (rows, cache length), written in place, and
  the forward ``torch.compile``d once per bucket shape: on a GPU with CUDA graphs (``reduce-overhead``), which
  takes the per-layer launches off the host. Rows that end stay in their bucket (their outputs unread) until half
  of it has ended; then the rows still sampling move to a bucket half the size. The caches live as long as the
  engine, so a bucket's graph replays on the same buffers in every rollout.
"""

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache

from models import resolve_device
from tasks.common.config import Params

LENGTH_BUCKET = 64  # cache lengths are rounded up to a multiple: fewer shapes to compile
SMALLEST_BUCKET = 8  # rows: below this, moving to a smaller bucket saves less than a compile costs


def compiled_decoding(params: Params) -> bool:
    """Whether ``params.decoding`` asks for the compiled step on params' device (auto: on a GPU only)."""
    if params.decoding == "auto":
        return resolve_device(params.device).type == "cuda"
    return params.decoding == "compiled"


class EagerDecoder:
    """The model's forward over transformers' ``DynamicCache``; ended rows leave the batch and the cache."""

    def __init__(
        self, model: PreTrainedModel, cache: DynamicCache, attention_mask: torch.Tensor, position: torch.Tensor
    ):
        self.model, self.cache, self.attention_mask, self.position = model, cache, attention_mask, position

    def keep(self, running: torch.Tensor) -> None:
        """Keep the rows at ``running`` (indices into the rows sampling until now)."""
        self.cache.batch_select_indices(running)
        self.attention_mask, self.position = self.attention_mask[running], self.position[running]

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """(rows, vocab) logits of the next token after each running row's ``token`` (rows,)."""
        self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(len(token), 1)], -1)
        logits = self.model(
            input_ids=token[:, None],
            # ready-made, (rows, 1, 1, cached + 1): transformers would build the same mask from the 2-D one
            # with dozens of ops per token (an eighth of the tiny model's decoding step)
            attention_mask=self.attention_mask[:, None, None, :].bool(),
            position_ids=self.position,
            past_key_values=self.cache,
            use_cache=True,
        ).logits[:, -1]
        self.position = self.position + 1
        return logits


def _forward_step(
    model: PreTrainedModel, token: torch.Tensor, mask: torch.Tensor, position: torch.Tensor, cache: StaticCache
) -> torch.Tensor:
    return model(
        input_ids=token, attention_mask=mask, position_ids=position, past_key_values=cache, use_cache=True
    ).logits[:, -1]


class CompiledSteps:
    """What a compiled decoder keeps between rollouts: the compiled step and a static cache per bucket."""

    def __init__(self, device: torch.device):
        # reduce-overhead captures CUDA graphs; a CPU has none to capture
        self.graphs = device.type == "cuda"
        mode = "reduce-overhead" if self.graphs else None
        self._step = torch.compile(_forward_step, mode=mode, dynamic=False)
        self.caches: dict[tuple[int, int, torch.dtype], StaticCache] = {}

    def step(
        self,
        model: PreTrainedModel,
        token: torch.Tensor,
        mask: torch.Tensor,
        position: torch.Tensor,
        cache: StaticCache,
    ) -> torch.Tensor:
        """(rows, vocab) logits after ``token`` (rows, 1), ``mask`` (rows, 1, 1, cache length) the slots to attend."""
        if self.graphs:
            # each call a new step of CUDA graph trees: the previous step's outputs, already read, may be reused
            torch.compiler.cudagraph_mark_step_begin()
        return self._step(model, token, mask, position, cache)

    def cache(self, model: PreTrainedModel, rows: int, length: int, dtype: torch.dtype) -> StaticCache:
        """The bucket's cache, emptied."""
        key = (rows, length, dtype)
        if key not in self.caches:
            config = model.config
            cache = StaticCache(config=config, max_cache_len=length)
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            cache.early_initialization(rows, heads, head_dim, dtype, model.device)
            self.caches[key] = cache
        cache = self.caches[key]
        cache.reset()
        return cache


class CompiledDecoder:
    """The compiled step over a static cache per bucket of rows (powers of two) and cache length."""

    def __init__(
        self,
        model: PreTrainedModel,
        prefilled: DynamicCache,
        attention_mask: torch.Tensor,
        position: torch.Tensor,
        max_new_tokens: int,
        steps: CompiledSteps,
    ):
        self.model, self.steps = model, steps
        rows, self.filled = attention_mask.shape
        self.length = -(-(self.filled + max_new_tokens) // LENGTH_BUCKET) * LENGTH_BUCKET
        self.attention_mask = attention_mask.new_zeros(rows, self.length, dtype=torch.bool)
        self.attention_mask[:, : self.filled] = attention_mask.bool()
        self.position = position
        self._move([(layer.keys, layer.values) for layer in prefilled.layers], torch.arange(rows), bucket(rows))

    def _move(self, states: list[tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor, size: int) -> None:
        """Write the cached keys and values of ``rows`` (padded with copies of the first, whose outputs are
        never read) into the emptied cache of a ``size``-row bucket."""
        index = torch.cat([rows, rows[:1].expand(size - len(rows))]).to(self.position.device)
        dtype = states[0][0].dtype
        self.cache = self.steps.cache(self.model, size, self.length, dtype)
        for layer, (keys, values) in enumerate(states):
            self.cache.update(keys[index, :, : self.filled], values[index, :, : self.filled], layer)
        self.attention_mask, self.position = self.attention_mask[index], self.position[index]
        self.tokens = self.position.new_zeros(size)  # the bucket's input tokens; padding and ended rows' unread
        self.slots = torch.arange(len(rows), device=index.device)  # each running row's row in the bucket

    def keep(self, running: torch.Tensor) -> None:
        self.slots = self.slots[running]
        size = len(self.tokens)
        if size > SMALLEST_BUCKET and 0 < len(self.slots) <= size // 2:  # none left: the rollout is over
            states = [(layer.keys, layer.values) for layer in self.cache.layers]
            self._move(states, self.slots, bucket(len(self.slots)))

    def step(self, token: torch.Tensor) -> torch.Tensor:
        self.tokens[self.slots] = token
        self.attention_mask[:, self.filled] = True
        self.filled += 1
        logits = self.steps.step(
            self.model, self.tokens[:, None], self.attention_mask[:, None, None, :], self.position, self.cache
        )
        self.position = self.position + 1
        return logits[self.slots]


def bucket(rows: int) -> int:
    """The bucket a batch of ``rows`` runs in: the next power of two, at least SMALLEST_BUCKET."""
    return max(SMALLEST_BUCKET, 1 << (rows - 1).bit_length())
