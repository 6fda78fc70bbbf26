"""Sampling speed: the HF engine against transformers' ``generate`` or against vLLM, same model, prompts and sampling.

- ``--against generate`` (the default): the engine (``tasks/rollout/hf_engine.py``) prefills each prompt once for
  its n samples and drops a row from the batch at its end-of-sequence. The baseline is ``model.generate`` with
  ``num_return_sequences`` (log-probs from its output logits), which prefills every sample and computes every row
  until the longest one ends. The model is the default task's cold-start SFT model, whose completions end at
  different lengths as real ones do; it is built in a scratch clone (``alignflow stage data / base / sft_cold``)
  unless ``--project`` names a project that has ``artifacts/sft_cold``. Workloads: a GRPO rollout (32 prompts x 8
  samples), eval's pass@k sampling (200 x 8) and its greedy pass@1 (200).
- ``--against vllm`` (needs vLLM: ``pip install -e ".[vllm]"``): HFEngine and VLLMEngine on a ~25M-parameter tiny
  Llama of the project's family (hidden 512, 8 layers, 8 heads, MLP 1408) with random weights, saved to a temporary
  directory without an end-of-sequence token, so both engines generate exactly ``--max-new-tokens`` tokens for
  every completion (checked). Engine start-up is not timed. HF runs first, because an in-process vLLM engine turns
  ``torch.set_num_threads`` into a no-op for the rest of the process.
- ``--against precision``: the eval stage's two passes (greedy pass@1 and one sample per prompt, 200 held-out
  prompts x 40 new tokens) over SmolLM2 after its cold start (``examples/smollm2.args``; built in a scratch clone
  unless ``--project`` names such a project), through the engine ``policy_engine`` gives the eval stage, in fp32
  and in bf16 (``eval.precision``).
- ``--against compile``: the engine's eager decoding step against its compiled one (``decoding: compiled``:
  static caches per batch bucket, ``tasks/rollout/decoding.py``) over the cold-start model, on each workload;
  prints the compiled engine's first call (its compilation), each one's median, whether their samples are the same
  and how far apart their log-probs are.
- ``--model-config DIR`` (on a GPU: SmolLM2's config.json and tokenizer files, random weights, as ``bench.trl.grpo
  --model-config``): where an adapted SmolLM2's sampling time goes, one rollout of 16 prompts x 8, 40 new tokens,
  through the engine over the PEFT model (with and without deterministic algorithms) and over a plain model, eager
  and with the compiled decoding step (CUDA graphs; the bar: 15,000 tokens/s in bf16), and through ``generate``
  over each (the plain model also with transformers' static cache, which it compiles); then the op profile of the
  engine over the PEFT model.

Each call is timed ``--repeats`` times after a warm-up (the calls of a workload alternating), and the median
reported.

    .venv/bin/python -m bench.speed.sampling [--project DIR] [--repeats 5]
    .venv/bin/python -m bench.speed.sampling --against vllm [--prompts 256] [--n 2] [--max-new-tokens 32]
    .venv/bin/python -m bench.speed.sampling --against precision [--project DIR] [--repeats 2]
    .venv/bin/python -m bench.speed.sampling --against compile [--project DIR] [--repeats 5]
    python -m bench.speed.sampling --model-config DIR    # on the lent GPU machine: PYTHONPATH as bench/gpu/run.sh sets
"""

import argparse
import os
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from bench.harness import cold_start_project, synchronize
from bench.trl.grpo_in_process import SYSTEM_PROMPT, problems
from models import build_char_tokenizer, build_tiny_llama, load_policy, load_tokenizer
from models.trainable import prepared_for_training
from tasks.common.config import ArithmeticConfig, BaseConfig, LoraConfig, Params
from tasks.data.datasets import read_examples
from tasks.data.problems import arithmetic, score_response
from tasks.data.prompts import BARE, PromptFormat
from tasks.params.load import load_params
from tasks.rollout.engine import Sampling
from tasks.rollout.hf_engine import HFEngine, policy_engine

WORKLOADS = {
    "GRPO rollout, 32 prompts x 8": (32, Sampling(64, n=8)),
    "pass@k sampling, 200 x 8": (200, Sampling(64, n=8)),
    "greedy pass@1, 200": (200, Sampling(64, greedy=True)),
}
# the tiny Llama of --against vllm
VLLM_MODEL = BaseConfig(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=1408, max_position_embeddings=128)
SEED = 0


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
            synchronize()
            started = time.perf_counter()
            results[label] = call()
            synchronize()
            seconds[label].append(time.perf_counter() - started)
    return {label: statistics.median(values[1:]) for label, values in seconds.items()}, results


def against_generate(project: Path | None, repeats: int) -> None:
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


def against_precision(project: Path | None, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        project = project or cold_start_project(Path(scratch) / "project", ["@examples/smollm2.args"])
        params = load_params(project / "params.yaml")
        test_file = project / "artifacts/data/test.jsonl"
        examples = read_examples(test_file)
        engines = {
            precision: policy_engine(
                replace(params, eval=replace(params.eval, precision=precision)),
                project / "artifacts/sft_cold",
                {test_file: examples},
                "eval",
            )
            for precision in ("fp32", "bf16")
        }
    prompts = [e.prompt for e in examples]
    greedy = Sampling(params.eval.max_new_tokens, greedy=True)
    sampled = Sampling(params.eval.max_new_tokens, n=1, temperature=params.eval.temperature)
    medians, results = measure(
        {p: lambda e=e: (e.generate(prompts, greedy), e.generate(prompts, sampled)) for p, e in engines.items()},
        repeats,
    )
    print(
        f"SmolLM2 after sft_cold; {len(prompts)} prompts, greedy then one sample each; torch threads "
        f"{torch.get_num_threads()}; median of {repeats}"
    )
    print(f"{'precision':<10}{'seconds':>10}{'tokens/s':>10}{'greedy pass@1':>15}")
    for precision, (greedy_rows, sampled_rows) in results.items():
        tokens = sum(len(c.token_ids) for c in greedy_rows + sampled_rows)
        passed = sum(score_response(examples[c.prompt_index], c.text)[1] for c in greedy_rows) / len(greedy_rows)
        print(f"{precision:<10}{medians[precision]:>9.1f}s{tokens / medians[precision]:>10.0f}{passed:>15.3f}")
    print(f"bf16 speed-up: {medians['fp32'] / medians['bf16']:.2f}x")


def save_model(path: Path) -> int:
    """Save the benchmark model with its tokenizer; returns its parameter count."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(VLLM_MODEL, tokenizer, SEED)
    tokenizer.eos_token = None
    model.config.eos_token_id = model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def fixed_length(measured: tuple[dict[str, float], dict[str, Any]], length: int) -> dict[str, tuple[float, int, int]]:
    """(median seconds, completions, tokens) of each call, whose completions are checked to be ``length`` long."""
    medians, results = measured
    for label, completions in results.items():
        lengths = {len(c.token_ids) for c in completions}
        assert lengths == {length}, f"{label}: completion lengths {lengths}: generation was not fixed-length"
    return {label: (medians[label], len(results[label]), len(results[label]) * length) for label in medians}


def against_vllm(num_prompts: int, n: int, max_new_tokens: int, repeats: int, hf_batch_size: int) -> None:
    from tasks.rollout.vllm_engine import VLLMEngine

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
        results |= fixed_length(measure({"hf": lambda: hf.generate(prompts, sampling)}, repeats), max_new_tokens)
        vllm = VLLMEngine(path, SEED, VLLM_MODEL.max_position_embeddings, BARE)
        results |= fixed_length(measure({"vllm": lambda: vllm.generate(prompts, sampling)}, repeats), max_new_tokens)

    print(f"{'engine':<8}{'seconds':>10}{'completions/s':>16}{'tokens/s':>12}")
    for name, (seconds, completions, tokens) in results.items():
        print(f"{name:<8}{seconds:>10.2f}{completions / seconds:>16.1f}{tokens / seconds:>12.0f}")
    print(f"vllm/hf throughput: {results['hf'][0] / results['vllm'][0]:.2f}x")


def on_a_gpu(model_config: Path, repeats: int) -> None:
    def timed(label: str, sample) -> None:
        medians, results = measure({label: sample}, repeats)
        seconds, result = medians[label], results[label]
        # the engine's completions stop at end-of-sequence; generate's run min_new_tokens, all 40
        tokens = sum(len(c.token_ids) for c in result) if isinstance(result, list) else 128 * 40
        print(f"{label:60s} {seconds:.3f} s, {tokens / seconds:,.0f} tokens/s ({tokens} tokens)", flush=True)

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    device = torch.device("cuda")
    tokenizer = AutoTokenizer.from_pretrained(model_config)
    config = AutoConfig.from_pretrained(model_config)
    torch.manual_seed(SEED)
    cfg = replace(Params().grpo, lora=LoraConfig(rank=16, alpha=32.0), precision="bf16-mixed")
    adapted = prepared_for_training(AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device), cfg)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device)
    prompt_format = PromptFormat("auto", SYSTEM_PROMPT)
    prompts = [example.prompt for example in problems(16, 0)]
    sampling = Sampling(40, n=8, temperature=1.0)
    engine, plain_engine, compiled_engine = (
        HFEngine(adapted, tokenizer, 16, prompt_format),
        HFEngine(plain, tokenizer, 16, prompt_format),
        HFEngine(plain, tokenizer, 16, prompt_format, compiled=True),
    )
    with torch.autocast("cuda", dtype=torch.bfloat16):
        timed("engine, PEFT model, bf16 autocast", lambda: engine.generate(prompts, sampling))
        torch.use_deterministic_algorithms(True, warn_only=True)
        timed("engine, PEFT model, bf16 autocast, deterministic", lambda: engine.generate(prompts, sampling))
        torch.use_deterministic_algorithms(False)
    timed("engine, plain bf16 model (the adapters merged)", lambda: plain_engine.generate(prompts, sampling))
    started = time.perf_counter()
    compiled_engine.generate(prompts, sampling)
    print(f"compiled decoding: first call (compilation, graph capture) {time.perf_counter() - started:.1f} s")
    timed(
        "engine, plain bf16 model, compiled decoding (CUDA graphs)", lambda: compiled_engine.generate(prompts, sampling)
    )
    tokenizer.padding_side = "left"
    conversations = [[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": p}] for p in prompts]
    inputs = tokenizer.apply_chat_template(
        conversations, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    ).to(device)

    def generate(model, cache: str | None = None):
        return lambda: model.generate(
            **inputs,
            do_sample=True,
            top_k=0,
            max_new_tokens=40,
            min_new_tokens=40,
            num_return_sequences=8,
            cache_implementation=cache,
        )

    with torch.autocast("cuda", dtype=torch.bfloat16):
        timed("transformers' generate, PEFT model, bf16 autocast", generate(adapted))
    timed("transformers' generate, plain bf16 model", generate(plain))
    timed("transformers' generate, plain bf16 model, static cache (compiled)", generate(plain, "static"))
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.profiler.profile() as profile:
        engine.generate(prompts, sampling)
        torch.cuda.synchronize()
    print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def against_compile(project: Path | None, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        project = project or cold_start_project(Path(scratch) / "project")
        model_dir = project / "artifacts/sft_cold"
        model, tokenizer = load_policy(model_dir, torch.device("cpu")).eval(), load_tokenizer(model_dir)
        prompts = [e.prompt for e in read_examples(project / "artifacts/data/test.jsonl")]
    engines = {"eager": HFEngine(model, tokenizer, 256, BARE), "compiled": HFEngine(model, tokenizer, 256, BARE, True)}
    print(f"cold-start model; torch threads {torch.get_num_threads()}; median of {repeats}")
    for name, (count, sampling) in WORKLOADS.items():
        started = time.perf_counter()
        engines["compiled"].generate(prompts[:count], sampling)  # compiles the step for the buckets it meets
        compiling = time.perf_counter() - started
        calls = {
            label: lambda e=engine, c=count, s=sampling: e.generate(prompts[:c], s) for label, engine in engines.items()
        }
        medians, results = measure(calls, repeats)
        eager, compiled = results["eager"], results["compiled"]
        same = [c.token_ids for c in eager] == [c.token_ids for c in compiled]
        pairs = [(x, y) for x, y in zip(eager, compiled, strict=True) if x.token_ids == y.token_ids]
        gap = max((abs(a - b) for x, y in pairs for a, b in zip(x.logprobs, y.logprobs, strict=True)), default=0.0)
        ratio = medians["eager"] / medians["compiled"]
        print(
            f"{name}: eager {medians['eager']:.3f} s, compiled {medians['compiled']:.3f} s (first call "
            f"{compiling:.1f} s): compiled {ratio:.2f}x eager's speed; the same samples: {same}, log-probs of "
            f"the same samples apart by up to {gap:.1e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", choices=("generate", "vllm", "precision", "compile"), default="generate")
    parser.add_argument("--repeats", type=int, help="timed calls of each (default 5; vllm 3; precision, GPU 2)")
    parser.add_argument("--project", type=Path, help="a project with artifacts/sft_cold (default: build one)")
    parser.add_argument("--model-config", type=Path, help="on a GPU: SmolLM2's config.json and tokenizer files")
    vllm = parser.add_argument_group("against vllm")
    vllm.add_argument("--prompts", type=int, default=256)
    vllm.add_argument("--n", type=int, default=2, help="samples per prompt")
    vllm.add_argument("--max-new-tokens", type=int, default=32)
    vllm.add_argument("--hf-batch-size", type=int, default=256, help="prompts per HF generate batch")
    args = parser.parse_args()
    if args.model_config is not None:
        on_a_gpu(args.model_config, args.repeats or 2)
    elif args.against == "precision":
        against_precision(args.project, args.repeats or 2)
    elif args.against == "compile":
        against_compile(args.project, args.repeats or 5)
    elif args.against == "vllm":
        against_vllm(args.prompts, args.n, args.max_new_tokens, args.repeats or 3, args.hf_batch_size)
    else:
        against_generate(args.project, args.repeats or 5)


if __name__ == "__main__":
    main()
