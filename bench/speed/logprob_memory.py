"""Peak memory of a log-prob pass over a batch of preference pairs (what dpo_reference, the reference role and the
reward kinds that read log-probs run, under no_grad): ``response_logprobs``, which keeps each group of rows'
log-probs and drops its logits, beside the whole batch's logits (``response_logprobs_and_logits``, which the
policy update reads), each in a process of its own on the same pairs.

The pairs are random tokens: ``--pairs`` prompts of ``--prompt-tokens`` each, two responses per prompt of between
half and all of ``--response-tokens``. A pass's memory is its process's peak resident set above what it held
before the pass (the peak is reset, ``/proc/self/clear_refs``, after a warm-up pass on two rows).

    .venv/bin/python -m bench.speed.logprob_memory [--model tiny|smollm2] [--pairs 64] [--project DIR]
    .venv/bin/python -m bench.speed.logprob_memory --model-dir DIR  # a model you have: a project's artifacts/base
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.harness import built_project, overlay, peak_mib
from models import load_reference
from tasks.rl.sequences import pack, response_logprobs, response_logprobs_and_logits

PASSES = {
    "grouped": response_logprobs,
    "whole batch": lambda model, batch, temperature: response_logprobs_and_logits(model, batch, temperature)[0],
}


def one_pass(model_dir: Path, how: str, pairs: int, prompt_tokens: int, response_tokens: int) -> dict[str, float]:
    """In this process: the peak MiB of one ``how`` pass over the pairs, above what the process held before it."""
    model = load_reference(model_dir, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    vocabulary = model.config.vocab_size
    prompts = torch.randint(vocabulary, (pairs, prompt_tokens), generator=generator).tolist()
    lengths = torch.randint(response_tokens // 2, response_tokens + 1, (2 * pairs,), generator=generator)
    responses = [torch.randint(vocabulary, (int(n),), generator=generator).tolist() for n in lengths]
    batch = pack(prompts * 2, responses, pad_id=0)  # row i and row pairs + i share prompt i, as pack_pairs lays out
    with torch.no_grad():
        PASSES[how](model, batch.select(torch.tensor([0, pairs])), 1.0)
        peak = peak_mib(lambda: PASSES[how](model, batch, 1.0))
    return {"peak_mib": peak, "rows": 2 * pairs, "vocabulary": vocabulary}


def model_directory(model: str, project: Path) -> Path:
    """The base model's Hugging Face directory in ``project``: the tiny default or SmolLM2 through the overlay."""
    built_project(project, ("data", "base"), overlay() if model == "smollm2" else [])
    return project / "artifacts" / "base"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--response-tokens", type=int, default=40)
    parser.add_argument("--project", type=Path, help="the project to build once and reuse (default: a scratch one)")
    parser.add_argument("--one", choices=sorted(PASSES), help=argparse.SUPPRESS)  # a single pass, in this process
    parser.add_argument("--model-dir", type=Path, help="a Hugging Face model directory to measure instead of --model's")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_pass(args.model_dir, args.one, args.pairs, args.prompt_tokens, args.response_tokens)))
        return
    model_dir = args.model_dir or model_directory(
        args.model, args.project or Path(tempfile.mkdtemp(prefix="logprob-memory-")) / "p"
    )
    results = {}
    for how in PASSES:
        command = [sys.executable, "-m", "bench.speed.logprob_memory", "--one", how, "--model-dir", str(model_dir)]
        sizes = [
            f"--pairs={args.pairs}",
            f"--prompt-tokens={args.prompt_tokens}",
            f"--response-tokens={args.response_tokens}",
        ]
        done = subprocess.run(command + sizes, check=True, capture_output=True, text=True)
        results[how] = json.loads(done.stdout.splitlines()[-1])
        print(f"{how:>12}: {results[how]['peak_mib']:8.0f} MiB above the loaded model", flush=True)
    first = next(iter(results.values()))
    ratio = results["whole batch"]["peak_mib"] / max(results["grouped"]["peak_mib"], 1e-9)
    print(f"{first['rows']} rows over a vocabulary of {first['vocabulary']}: whole-batch logits take {ratio:.2f}x")


if __name__ == "__main__":
    main()
