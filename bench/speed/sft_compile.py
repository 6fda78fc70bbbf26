"""SFT steps per second and MFU at the default model and batch: eager against ``torch.compile`` (inductor on CPU,
dynamic shapes), side by side, alternating legs so drift hits both alike.

Each leg trains a freshly built default model on the default task's batches (AdamW, gradient clipping) for
``--steps`` steps after ``--warmup`` (the compiled leg's first steps compile). MFU is 6 x parameters x real tokens
per second over the machine's measured fp32 matmul peak (``tasks/common/flops.py``).

    .venv/bin/python -m bench.speed.sft_compile [--rounds 2] [--steps 60]
"""

import argparse
import statistics
import time

import torch

from models import build_char_tokenizer, build_tiny_llama
from tasks.algos.supervised import sft_loss
from tasks.common.flops import mfu
from tasks.data.datasets import generate_splits
from tasks.data.prompts import BARE
from tasks.params.load import load_params
from tasks.stages.sft import SFTBatches


def leg(batches: SFTBatches, params, tokenizer, compiled: bool, steps: int, warmup: int) -> tuple[float, float]:
    """(steps per second, MFU) of one leg."""
    model = build_tiny_llama(params.base, tokenizer, params.seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.sft.lr)
    forward = torch.compile(model, dynamic=True) if compiled else model
    tokens, started = 0, 0.0
    for step in range(warmup + steps):
        if step == warmup:
            tokens, started = 0, time.perf_counter()
        batch = batches[step]
        tokens += int(batch["attention_mask"].sum())
        logits = forward(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = sft_loss(logits, batch["input_ids"], batch["loss_mask"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), params.sft.grad_clip)
        optimizer.step()
    seconds = time.perf_counter() - started
    parameters = sum(p.numel() for p in model.parameters())
    return steps / seconds, mfu(parameters, tokens, seconds, torch.get_num_threads())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=8)
    args = parser.parse_args()
    params = load_params("params.yaml", ["data.num_train=4096"])
    train, _ = generate_splits(params.task, params.data.num_train, params.data.num_test, params.seed)
    tokenizer = build_char_tokenizer()
    batches = SFTBatches(train, tokenizer, BARE, params.sft, "generated", params.seed, "sft")
    results: dict[str, list[tuple[float, float]]] = {"eager": [], "compiled": []}
    for _ in range(args.rounds):
        for name in results:
            results[name].append(leg(batches, params, tokenizer, name == "compiled", args.steps, args.warmup))
    rates = {}
    for name, runs in results.items():
        rates[name] = statistics.median(rate for rate, _ in runs)
        utilisation = statistics.median(mfu for _, mfu in runs)
        print(f"{name:<9} {rates[name]:6.2f} steps/s  MFU {utilisation:.3f}  ({torch.get_num_threads()} threads)")
    print(f"torch.compile: {rates['compiled'] / rates['eager']:.2f}x eager")


if __name__ == "__main__":
    main()
