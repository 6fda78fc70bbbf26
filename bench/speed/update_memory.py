"""Peak memory and time of one policy update (the actor's ``update`` with GRPO's loss, LoRA as the SmolLM2 overlay
trains it) on one minibatch of random-token responses: the whole minibatch in one forward and backward pass, beside
micro-batches of ``--micro`` responses whose gradients are summed into the same step (``micro_batch_size``). Each
update runs in a process of its own, after a warm-up update on two responses; its memory is the process's peak
resident set above what it held before the update.

    .venv/bin/python -m bench.speed.update_memory [--model tiny|smollm2] [--responses 128] [--micro 32]
    .venv/bin/python -m bench.speed.update_memory --model-dir DIR  # a model you have: a project's artifacts/base
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from bench.harness import REPO, peak_mib
from bench.speed.logprob_memory import model_directory
from tasks.params.load import load_params
from tasks.rl.policy_gradient import policy_gradient_loss
from tasks.rl.sequences import pack
from tasks.rl.workers import ActorLoss, ActorWorker


def one_update(model_dir: Path, micro: int, responses: int, prompt_tokens: int, response_tokens: int) -> dict:
    """In this process: the peak MiB and the seconds of one update over ``responses`` (micro-batches of ``micro``;
    0: the whole minibatch at once)."""
    settings = ["lora.rank=16", "lora.alpha=32", "epochs=1", "warmup_steps=0", "kl_loss=none", "actor_lr=1e-5"]
    settings += [f"minibatch_size={responses}"] + ([f"micro_batch_size={micro}"] if micro else [])
    params = load_params(REPO / "params.yaml", [f"grpo.{setting}" for setting in settings])
    actor = ActorWorker(params, params.grpo, model_dir)
    generator = torch.Generator().manual_seed(0)
    vocabulary = actor.model.config.vocab_size
    prompts = torch.randint(vocabulary, (responses, prompt_tokens), generator=generator).tolist()
    lengths = torch.randint(response_tokens // 2, response_tokens + 1, (responses,), generator=generator)
    batch = pack(prompts, [torch.randint(vocabulary, (int(n),), generator=generator).tolist() for n in lengths], 0)
    advantages = torch.randn(responses, 1, generator=generator) * batch.response_mask
    loss = ActorLoss(partial(policy_gradient_loss, kl_coef=0.0))
    warm = torch.tensor([0, 1])
    actor.update(batch.select(warm), loss, {"advantages": advantages[warm]})
    started = time.perf_counter()
    peak = peak_mib(lambda: actor.update(batch, loss, {"advantages": advantages}))
    return {"peak_mib": peak, "seconds": time.perf_counter() - started, "vocabulary": vocabulary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--responses", type=int, default=128, help="the minibatch (GRPO's overlay: 16 prompts x 8)")
    parser.add_argument("--micro", type=int, default=32, help="responses per micro-batch")
    parser.add_argument("--prompt-tokens", type=int, default=40)
    parser.add_argument("--response-tokens", type=int, default=40)
    parser.add_argument("--project", type=Path, help="the project to build once and reuse (default: a scratch one)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a single update in this process (0: whole)
    parser.add_argument("--model-dir", type=Path, help="a Hugging Face model directory to measure instead of --model's")
    args = parser.parse_args()
    sizes = (args.responses, args.prompt_tokens, args.response_tokens)
    if args.one is not None:
        print(json.dumps(one_update(args.model_dir, args.one, *sizes)))
        return
    model_dir = args.model_dir or model_directory(
        args.model, args.project or Path(tempfile.mkdtemp(prefix="update-memory-")) / "p"
    )
    results = {}
    for micro in (0, args.micro):
        command = [
            sys.executable,
            "-m",
            "bench.speed.update_memory",
            "--one",
            str(micro),
            "--model-dir",
            str(model_dir),
        ]
        command += [f"--responses={args.responses}", f"--prompt-tokens={args.prompt_tokens}"]
        done = subprocess.run([*command, f"--response-tokens={args.response_tokens}"], check=True, capture_output=True)
        results[micro] = json.loads(done.stdout.decode().splitlines()[-1])
        how = f"micro-batches of {micro}" if micro else "whole minibatch"
        print(f"{how:>20}: {results[micro]['peak_mib']:8.0f} MiB, {results[micro]['seconds']:6.1f} s", flush=True)
    whole, cut = results[0], results[args.micro]
    memory, time_ratio = whole["peak_mib"] / max(cut["peak_mib"], 1e-9), whole["seconds"] / cut["seconds"]
    print(
        f"{args.responses} responses over a vocabulary of {whole['vocabulary']}: the whole minibatch takes "
        f"{memory:.2f}x the memory and {time_ratio:.2f}x the time of micro-batches"
    )


if __name__ == "__main__":
    main()
