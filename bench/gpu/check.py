"""The real-model pipeline on a CUDA device, as GPU users run it, or (``--model-config``) its model-level check.

- The pipeline (where vLLM, Ray and DVC are installed): SmolLM2-135M-Instruct through base -> sft_cold (LoRA,
  bf16-mixed) -> grpo (LoRA, bf16-mixed, the vLLM engine colocated in sleep mode) -> eval@grpo, printing each
  stage's wall-clock, GRPO's phases, its update tokens/s and MFU against this GPU's measured bf16 matmul peak, and
  held-out pass@1. The stages' own perf.json measure MFU against the CPU's fp32 peak (tasks/common/flops.py); on a
  GPU this figure, against the GPU's bf16 peak, is the one to read.
- The model-level check (``--model-config DIR``: SmolLM2's config.json and tokenizer files), for a machine without
  the pipeline's own packages (vLLM, Ray, DVC): SmolLM2-135M's architecture (random weights: speed does not depend
  on them) with LoRA in bf16-mixed, through alignflow's own code: HFEngine sampling through the chat template, the
  policy's log-probs over the sampled ids, an update, the adapter-disabled reference and the merged weights. Prints
  (and writes to --out) sampling and update tokens/s, the update's MFU against the measured bf16 matmul peak, and the
  checks' largest differences.

    .venv/bin/python -m bench.gpu.check              # needs a CUDA GPU and vLLM's GPU build (pip install vllm)
    .venv/bin/python -m bench.gpu.check --steps 20
    python -m bench.gpu.check --model-config DIR [--out FILE]      # --device cpu: a dry run, small sizes

docs/real-models.md records what they printed, and where.
"""

import argparse
import copy
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from bench.harness import OVERLAY, REPO, clone, device_matmul_peak, stage, synchronize
from models.trainable import adapters_disabled, autocast, merged_state_dict, prepared_for_training
from tasks.common.config import LoraConfig, Params
from tasks.data.problems import Example
from tasks.data.prompts import PromptFormat
from tasks.rl.learner import Rollout
from tasks.rl.sequences import response_logprobs
from tasks.rollout.engine import Sampling
from tasks.rollout.hf_engine import HFEngine

ON_A_GPU = (
    "device=cuda",
    "grpo.rollout_backend=vllm",
    "grpo.vllm.sleep_mode=true",  # colocated: the engine sleeps through each update
    "grpo.vllm.gpu_memory_utilization=0.3",
    "sft_cold.max_steps=100",
)


def timed(function):
    synchronize()
    started = time.perf_counter()
    result = function()
    synchronize()
    return result, time.perf_counter() - started


def pipeline_check(steps: int) -> None:
    overrides = [f"@{REPO / OVERLAY}", *ON_A_GPU, f"grpo.steps={steps}"]
    peak = device_matmul_peak(torch.device("cuda"))
    with tempfile.TemporaryDirectory() as scratch:
        project = Path(scratch) / "project"
        clone(project)
        seconds = {}
        for name in ("data", "base", "sft_cold", "grpo", "eval@grpo"):
            started = time.perf_counter()
            stage(project, name, *overrides)
            seconds[name] = time.perf_counter() - started
        perf = json.loads((project / "metrics/grpo/perf.json").read_text())
        evaluation = json.loads((project / "metrics/eval/grpo/metrics.json").read_text())
    parameters = perf["parameters"]
    tokens_per_second = perf["update_tokens_per_second"]
    print(f"device: {torch.cuda.get_device_name()}, bf16 matmul peak {peak / 1e12:.0f} TFLOP/s (measured)")
    for name, value in seconds.items():
        print(f"  {name:<10} {value:8.1f} s")
    for phase in ("generate", "score", "train", "total"):
        print(f"  grpo {phase:<8} {perf[f'{phase}_seconds_per_step']:8.2f} s per iteration")
    print(f"  grpo update: {tokens_per_second:,.0f} tokens/s, MFU {6 * parameters * tokens_per_second / peak:.1%}")
    print(f"  eval@grpo pass@1 {evaluation['pass@1']:.3f} on the held-out split (data.num_test in the overlay)")


def model_check(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    device = torch.device(args.device)
    config, tokenizer = AutoConfig.from_pretrained(args.model_config), AutoTokenizer.from_pretrained(args.model_config)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device)
    cfg = replace(Params().grpo, lora=LoraConfig(rank=16, alpha=32.0), precision="bf16-mixed")
    policy = prepared_for_training(copy.deepcopy(base), cfg)
    with torch.no_grad():  # adapters away from zero, as after training
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.01)
    parameters = sum(p.numel() for p in base.parameters())
    rows = [json.loads(line) for line in (REPO / "examples/word_problems/test.jsonl").read_text().splitlines()]
    questions = [row["question"] for row in rows[: args.prompts]]

    engine = HFEngine(policy, tokenizer, args.prompts, PromptFormat("auto", None))
    sampling = Sampling(args.new_tokens, n=args.group, temperature=1.0)
    with autocast(policy, cfg.precision):
        engine.generate(questions[:4], Sampling(8, n=2))  # warm-up
        completions, sample_seconds = timed(lambda: engine.generate(questions, sampling))
    sampled_tokens = sum(len(c.token_ids) for c in completions)

    examples = [Example("examples.word_problems", questions[c.prompt_index], "0", "") for c in completions]
    batch = Rollout(examples, completions, torch.zeros(len(completions)), {}, {}).packed(tokenizer).to(device)
    advantages = torch.randn(len(completions), 1, device=device)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    real_tokens = int(batch.attention_mask.sum())

    def update() -> None:
        with autocast(policy, cfg.precision):
            logprobs = response_logprobs(policy, batch, 1.0)
        loss = -(logprobs * advantages * batch.response_mask).sum() / batch.response_mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    update()  # warm-up
    _, update_seconds = timed(lambda: [update() for _ in range(args.updates)])
    peak = device_matmul_peak(device)
    update_rate = real_tokens * args.updates / update_seconds

    with torch.no_grad():  # fp32, no autocast: the identities hold to float rounding
        probe = batch.select(torch.arange(8, device=device))
        with adapters_disabled(policy):
            reference = response_logprobs(policy, probe, 1.0)
        of_base = response_logprobs(base, probe, 1.0)
        adapted = response_logprobs(policy, probe, 1.0)
        merged = copy.deepcopy(base)
        merged.load_state_dict(merged_state_dict(policy))
        of_merged = response_logprobs(merged, probe, 1.0)
    mask = probe.response_mask.bool()
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "parameters": parameters,
        "bf16_matmul_peak_tflops": round(peak / 1e12, 1),
        "sampling_tokens_per_second": round(sampled_tokens / sample_seconds),
        "sampled": f"{args.prompts} prompts x {args.group}, up to {args.new_tokens} new tokens",
        "update_tokens_per_second": round(update_rate),
        "update_mfu": round(6 * parameters * update_rate / peak, 4),
        "update_batch": f"{len(completions)} sequences, {real_tokens} real tokens",
        "reference_vs_base_max_abs": (reference - of_base)[mask].abs().max().item(),
        "merged_vs_adapted_max_abs": (of_merged - adapted)[mask].abs().max().item(),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
    }
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="GRPO iterations of the pipeline")
    parser.add_argument("--model-config", type=Path, help="the model-level check on this architecture and tokenizer")
    parser.add_argument("--out", type=Path, help="the model-level check's JSON")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the model-level check, small sizes")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.gpu.check: no CUDA device is visible; this check runs on a GPU")
    if args.model_config is None:
        pipeline_check(args.steps)
    else:
        model_check(args)


if __name__ == "__main__":
    main()
