"""Where a GPU's sampling time goes for an adapted SmolLM2: one rollout of 16 prompts x 8, 40 new tokens, timed
(best of two after a warm-up) through alignflow's HF engine over the PEFT model (with and without deterministic
algorithms) and over a plain model, and through transformers' ``generate`` over each; then the op profile of the
engine over the PEFT model. SmolLM2's architecture and tokenizer with random weights, as ``bench/gpu_grpo_vs_trl.py``.

    python bench/gpu_sampling.py --model-config DIR     # on the lent machine: PYTHONPATH as bench/gpu_run.sh sets
"""

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

import torch
from gpu_grpo_vs_trl import SYSTEM_PROMPT, problems
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from models.trainable import prepared_for_training
from tasks.common.config import LoraConfig, Params
from tasks.data.prompts import PromptFormat
from tasks.rollout.engine import Sampling
from tasks.rollout.hf_engine import HFEngine


def timed(label: str, sample) -> None:
    sample()
    torch.cuda.synchronize()
    seconds = []
    for _ in range(2):
        started = time.perf_counter()
        sample()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    print(f"{label:60s} {min(seconds):.3f} s", flush=True)


def main(model_config: Path) -> None:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    device = torch.device("cuda")
    tokenizer = AutoTokenizer.from_pretrained(model_config)
    config = AutoConfig.from_pretrained(model_config)
    torch.manual_seed(0)
    cfg = replace(Params().grpo, lora=LoraConfig(rank=16, alpha=32.0), precision="bf16-mixed")
    adapted = prepared_for_training(AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device), cfg)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device)
    prompt_format = PromptFormat("auto", SYSTEM_PROMPT)
    prompts = [example.prompt for example in problems(16, 0)]
    sampling = Sampling(40, n=8, temperature=1.0)
    engine, plain_engine = (
        HFEngine(adapted, tokenizer, 16, prompt_format),
        HFEngine(plain, tokenizer, 16, prompt_format),
    )
    with torch.autocast("cuda", dtype=torch.bfloat16):
        timed("engine, PEFT model, bf16 autocast", lambda: engine.generate(prompts, sampling))
        torch.use_deterministic_algorithms(True, warn_only=True)
        timed("engine, PEFT model, bf16 autocast, deterministic", lambda: engine.generate(prompts, sampling))
        torch.use_deterministic_algorithms(False)
    timed("engine, plain bf16 model (the adapters merged)", lambda: plain_engine.generate(prompts, sampling))
    tokenizer.padding_side = "left"
    conversations = [[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": p}] for p in prompts]
    inputs = tokenizer.apply_chat_template(
        conversations, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    ).to(device)

    def generate(model):
        return lambda: model.generate(
            **inputs, do_sample=True, top_k=0, max_new_tokens=40, min_new_tokens=40, num_return_sequences=8
        )

    with torch.autocast("cuda", dtype=torch.bfloat16):
        timed("transformers' generate, PEFT model, bf16 autocast", generate(adapted))
    timed("transformers' generate, plain bf16 model", generate(plain))
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.profiler.profile() as profile:
        engine.generate(prompts, sampling)
        torch.cuda.synchronize()
    print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-config", type=Path, required=True, help="SmolLM2's config.json and tokenizer files")
    main(parser.parse_args().model_config)
