"""Rollout throughput: HFEngine and VLLMEngine side by side, same model, prompts and sampling, in one run.

The model is a ~25M-parameter tiny Llama of the project's family (hidden 512, 8 layers, 8 heads,
MLP 1408) with random weights, saved to a temporary directory. Random weights would end
completions at random lengths, so the saved model and tokenizer have no end-of-sequence token:
both engines generate exactly ``--max-new-tokens`` tokens for every completion (checked).
Engine start-up is not timed; each engine gets one untimed warm-up call, then ``--repeats``
timed calls, of which the median is reported. HF runs first, because an in-process vLLM engine
turns ``torch.set_num_threads`` into a no-op for the rest of the process.

    .venv/bin/python bench/rollout.py [--prompts 256] [--n 2] [--max-new-tokens 32] [--repeats 3]

Needs vLLM: ``pip install -e ".[vllm]"``.
"""

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from models import build_char_tokenizer, build_tiny_llama, load_policy, load_tokenizer
from tasks.common.config import ArithmeticConfig, BaseConfig
from tasks.data.problems import arithmetic
from tasks.data.prompts import BARE
from tasks.rollout.engine import RolloutEngine, Sampling
from tasks.rollout.hf_engine import HFEngine
from tasks.rollout.vllm_engine import VLLMEngine

MODEL = BaseConfig(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=1408, max_position_embeddings=128)
SEED = 0


def save_model(path: Path) -> int:
    """Save the benchmark model with its tokenizer; returns its parameter count."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(MODEL, tokenizer, SEED)
    tokenizer.eos_token = None
    model.config.eos_token_id = model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def measure(engine: RolloutEngine, prompts: list[str], sampling: Sampling, repeats: int) -> tuple[float, int, int]:
    """Median seconds per ``generate`` call after a warm-up, with the completions and tokens of one call."""
    engine.generate(prompts, sampling)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        completions = engine.generate(prompts, sampling)
        seconds.append(time.perf_counter() - start)
    lengths = {len(c.token_ids) for c in completions}
    assert lengths == {sampling.max_new_tokens}, f"completion lengths {lengths}: generation was not fixed-length"
    return statistics.median(seconds), len(completions), len(completions) * sampling.max_new_tokens


def main(num_prompts: int, n: int, max_new_tokens: int, repeats: int, hf_batch_size: int) -> None:
    rng = random.Random(SEED)
    prompts = [arithmetic.generate(rng, ArithmeticConfig()).prompt for _ in range(num_prompts)]
    sampling = Sampling(max_new_tokens, n=n, temperature=1.0)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch)
        num_parameters = save_model(path)
        print(
            f"model: {num_parameters / 1e6:.1f}M parameters; {num_prompts} prompts x {n} samples x "
            f"{max_new_tokens} new tokens, temperature {sampling.temperature}; torch threads {torch.get_num_threads()}"
        )
        hf = HFEngine(load_policy(path, torch.device("cpu")), load_tokenizer(path), hf_batch_size, BARE)
        results["hf"] = measure(hf, prompts, sampling, repeats)
        vllm = VLLMEngine(path, SEED, MODEL.max_position_embeddings, BARE)
        results["vllm"] = measure(vllm, prompts, sampling, repeats)

    print(f"{'engine':<8}{'seconds':>10}{'completions/s':>16}{'tokens/s':>12}")
    for name, (seconds, completions, tokens) in results.items():
        print(f"{name:<8}{seconds:>10.2f}{completions / seconds:>16.1f}{tokens / seconds:>12.0f}")
    print(f"vllm/hf throughput: {results['hf'][0] / results['vllm'][0]:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--n", type=int, default=2, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per engine (median reported)")
    parser.add_argument("--hf-batch-size", type=int, default=256, help="prompts per HF generate batch")
    args = parser.parse_args()
    main(args.prompts, args.n, args.max_new_tokens, args.repeats, args.hf_batch_size)
