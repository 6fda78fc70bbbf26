"""Sampling speed: the HF engine's own loop against transformers' ``generate``, same model, prompts and sampling.

The engine (``tasks/rollout/hf_engine.py``) prefills each prompt once for its n samples and drops a row from
the batch at its end-of-sequence. The baseline is ``model.generate`` with ``num_return_sequences``
(log-probs from its output logits), which prefills every sample and computes every row until the
longest one ends. The model is the default task's cold-start SFT model, whose completions end at
different lengths as real ones do; it is built in a scratch clone (``alignflow stage data / base /
sft_cold``) unless ``--project`` names a project that has ``artifacts/sft_cold``.

Workloads: a GRPO rollout (32 prompts x 8 samples), eval's pass@k sampling (200 x 8) and its greedy
pass@1 (200). Each is timed ``--repeats`` times per implementation, alternating, and the median
reported.

    .venv/bin/python bench/sampling.py [--project DIR] [--repeats 5]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from harness import cold_start_project
from transformers import GenerationConfig

from models import load_policy, load_tokenizer
from tasks.data.datasets import read_examples
from tasks.data.prompts import BARE
from tasks.rollout.engine import Sampling
from tasks.rollout.hf_engine import HFEngine

WORKLOADS = {
    "GRPO rollout, 32 prompts x 8": (32, Sampling(64, n=8)),
    "pass@k sampling, 200 x 8": (200, Sampling(64, n=8)),
    "greedy pass@1, 200": (200, Sampling(64, greedy=True)),
}


@torch.no_grad()
def generate_baseline(model, tokenizer, prompts: list[str], sampling: Sampling) -> list[tuple[list[int], list[float]]]:
    """(token ids up to end-of-sequence, their log-probs) of n samples per prompt, by ``model.generate``."""
    config = GenerationConfig(
        max_new_tokens=sampling.max_new_tokens,
        do_sample=not sampling.greedy,
        temperature=None if sampling.greedy else sampling.temperature,
        top_k=None if sampling.greedy else 0,
        num_return_sequences=sampling.n,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        return_dict_in_generate=True,
        output_logits=True,
    )
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    output = model.generate(**batch, generation_config=config)
    generated = output.sequences[:, batch["input_ids"].shape[1] :]
    logits = torch.stack(output.logits, dim=1).float() / (1.0 if sampling.greedy else sampling.temperature)
    logprobs = torch.log_softmax(logits, -1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)
    rows = []
    for token_ids, values in zip(generated.tolist(), logprobs.tolist(), strict=True):
        end = token_ids.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in token_ids else len(token_ids)
        rows.append((token_ids[:end], values[:end]))
    return rows


def measure(calls: dict, repeats: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Each call's median seconds over ``repeats`` alternating rounds after a warm-up round, and its result."""
    seconds: dict[str, list[float]] = {label: [] for label in calls}
    results = {}
    for _ in range(repeats + 1):
        for label, call in calls.items():
            torch.manual_seed(0)
            started = time.perf_counter()
            results[label] = call()
            seconds[label].append(time.perf_counter() - started)
    return {label: statistics.median(values[1:]) for label, values in seconds.items()}, results


def main(project: Path | None, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        project = project or cold_start_project(Path(scratch) / "project")
        model_dir = project / "artifacts/sft_cold"
        model, tokenizer = load_policy(model_dir, torch.device("cpu")), load_tokenizer(model_dir)
        prompts = [e.prompt for e in read_examples(project / "artifacts/data/test.jsonl")]
    model.eval()
    engine = HFEngine(model, tokenizer, 256, BARE)
    print(
        f"cold-start model, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters; "
        f"torch threads {torch.get_num_threads()}; median of {repeats}"
    )
    print(f"{'workload':<32}{'generate':>10}{'engine':>10}{'speed-up':>10}{'engine mean length':>20}")
    for name, (count, sampling) in WORKLOADS.items():
        batch = prompts[:count]
        medians, results = measure(
            {
                "generate": lambda batch=batch, sampling=sampling: generate_baseline(model, tokenizer, batch, sampling),
                "engine": lambda batch=batch, sampling=sampling: engine.generate(batch, sampling),
            },
            repeats,
        )
        length = sum(len(c.token_ids) for c in results["engine"]) / len(results["engine"])
        print(
            f"{name:<32}{medians['generate']:>9.3f}s{medians['engine']:>9.3f}s"
            f"{medians['generate'] / medians['engine']:>9.2f}x{length:>20.1f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, help="a project with artifacts/sft_cold (default: build one)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    main(args.project, args.repeats)
