"""The Hugging Face rollout engine: a sampling loop over a transformers model and its KV cache."""

from operator import attrgetter
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from models import context_length, load_policy, load_tokenizer, resolve_device
from models.trainable import compute_dtype
from tasks.common.config import Params
from tasks.data.datasets import check_prompt_lengths
from tasks.data.problems import Example
from tasks.data.prompts import PromptFormat, stop_token_ids
from tasks.kinds import prompt_limit_key
from tasks.rollout.decoding import CompiledDecoder, CompiledSteps, EagerDecoder, compiled_decoding
from tasks.rollout.engine import Completion, Sampling, opened_responses


class HFEngine:
    """Sampling over a Hugging Face model's forward pass and KV cache; full-distribution sampling (no top-k/top-p).

    Not ``model.generate``, which prefills every prompt once per sample and keeps computing rows
    that have ended until the longest one does: here each prompt is prefilled once and its cache
    copied to its ``n`` samples, and a row leaves the batch at its end-of-sequence (as vLLM's
    scheduler does). ``bench/speed/sampling.py``: 1.3-1.4x ``generate``'s speed on a GRPO rollout of the
    default task (32 prompts x 8), 1.25x on eval's pass@k sampling; greedy decoding gains little. The decoding
    step is eager or ``compiled`` (``tasks/rollout/decoding.py``: static caches per batch bucket, CUDA graphs on a
    GPU).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int,
        prompt_format: PromptFormat,
        compiled: bool = False,
    ):
        self.model, self.tokenizer, self.batch_size, self.prompt_format = model, tokenizer, batch_size, prompt_format
        self.stop_ids = stop_token_ids(tokenizer, model.generation_config)
        # the decoding step: eager, or compiled once per bucket over static caches kept for the engine's life
        self.compiled = CompiledSteps(model.device) if compiled else None

    def sync_weights(self, model: PreTrainedModel) -> None:
        if model is not self.model:  # the trainer's own model needs nothing
            self.model.load_state_dict(model.state_dict())

    def generate(self, prompts: list[str], sampling: Sampling) -> list[Completion]:
        completions = self.generate_ids(self.prompt_format.encode(self.tokenizer, prompts), sampling)
        return opened_responses(self.prompt_format, completions)

    @torch.no_grad()
    def generate_ids(self, prompt_ids: list[list[int]], sampling: Sampling) -> list[Completion]:
        was_training = self.model.training
        self.model.eval()
        completions = []
        starts = range(0, len(prompt_ids), self.batch_size)
        for start in tqdm(starts, desc="generate", leave=False, disable=len(starts) < 2):
            batch = prompt_ids[start : start + self.batch_size]
            for row, (token_ids, logprobs) in enumerate(self._sample(batch, sampling)):
                truncated = token_ids[-1] not in self.stop_ids
                text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
                index = row // sampling.n
                completions.append(Completion(start + index, batch[index], token_ids, text, logprobs, truncated))
        self.model.train(was_training)
        return completions

    def _sample(self, prompts: list[list[int]], sampling: Sampling) -> list[tuple[list[int], list[float]]]:
        """(token ids up to and including the stop token, their log-probs) of ``n`` samples per prompt."""
        model, n = self.model, sampling.n
        stop_ids = torch.tensor(self.stop_ids, device=model.device)
        temperature = 1.0 if sampling.greedy else sampling.temperature
        input_ids, attention_mask = left_padded(prompts, self.tokenizer.pad_token_id)
        input_ids, attention_mask = input_ids.to(model.device), attention_mask.to(model.device)
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        cache.batch_repeat_interleave(n)
        logits, attention_mask = logits.repeat_interleave(n, 0), attention_mask.repeat_interleave(n, 0)
        next_position = positions[:, -1:].repeat_interleave(n, 0) + 1

        if self.compiled is None:
            decoder = EagerDecoder(model, cache, attention_mask, next_position)
        else:
            decoder = CompiledDecoder(
                model, cache, attention_mask, next_position, sampling.max_new_tokens, self.compiled
            )

        rows = len(prompts) * n
        tokens = torch.full((rows, sampling.max_new_tokens), self.stop_ids[0], dtype=torch.long, device=model.device)
        token_logprobs = torch.zeros((rows, sampling.max_new_tokens), device=model.device)
        lengths = torch.full((rows,), sampling.max_new_tokens, device=model.device)
        active = torch.arange(rows, device=model.device)  # the rows still sampling, in the decoder's order
        for step in range(sampling.max_new_tokens):
            logprobs = torch.log_softmax(logits.float() / temperature, -1)
            token = logprobs.argmax(-1) if sampling.greedy else sample_tokens(logprobs.exp())
            tokens[active, step] = token
            token_logprobs[active, step] = logprobs.gather(-1, token[:, None]).squeeze(-1)
            ended = torch.isin(token, stop_ids)
            if ended.any():
                lengths[active[ended]] = step + 1
                running = (~ended).nonzero().squeeze(-1)
                active, token = active[running], token[running]
                decoder.keep(running)
            if len(active) == 0 or step + 1 == sampling.max_new_tokens:
                break
            logits = decoder.step(token)
        lengths = lengths.tolist()
        return [
            (ids[:length], values[:length])
            for ids, values, length in zip(tokens.tolist(), token_logprobs.tolist(), lengths, strict=True)
        ]


def sample_tokens(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` (R, V): one uniform draw per row against the cumulative distribution
    (``torch.multinomial`` draws V exponentials per row). A token of probability 0 is never drawn."""
    cumulative = probs.cumsum(-1)
    total = cumulative[:, -1:]
    # below the total even when the product rounds up, so the draw lands on a token of non-zero probability
    draw = torch.minimum(torch.rand(len(probs), 1, device=probs.device) * total, torch.nextafter(total, total * 0))
    return torch.searchsorted(cumulative, draw, right=True).squeeze(-1)


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask) of token-id prompts padded on the left to the longest."""
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    return input_ids, attention_mask


def policy_engine(
    params: Params,
    model_dir: Path,
    prompts: dict[Path, list[Example]],
    section: str,
    batch_size: int | None = None,
) -> HFEngine:
    """An engine sampling from the model in ``model_dir`` on params' device, in its prompt format and in the dtype of
    the params ``section``'s precision (an ``InferenceConfig``: eval, preferences, ...), ``batch_size`` prompts at a
    time (eval.batch_size by default), once the ``prompts`` of each source file are checked to fit the model with the
    section's ``max_new_tokens`` to spare."""
    cfg = getattr(params, section)
    new_tokens = (f"{section}.max_new_tokens", cfg.max_new_tokens)
    tokenizer, prompt_format = load_tokenizer(model_dir), PromptFormat.of(params.task)
    positions, limit = context_length(model_dir), attrgetter(prompt_limit_key(section))(params)
    for source, examples in prompts.items():
        check_prompt_lengths(examples, tokenizer, prompt_format, source, limit, positions, new_tokens)
    model = load_policy(model_dir, resolve_device(params.device), compute_dtype(cfg.precision))
    return params_engine(params, model, tokenizer, batch_size)


def params_engine(
    params: Params, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int | None = None
) -> HFEngine:
    """An engine over ``model`` in params' prompt format and ``decoding`` step, ``batch_size`` prompts at a time
    (eval.batch_size by default)."""
    prompt_format, compiled = PromptFormat.of(params.task), compiled_decoding(params)
    return HFEngine(model, tokenizer, batch_size or params.eval.batch_size, prompt_format, compiled)
