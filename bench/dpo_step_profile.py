"""Where one DPO step of the real model goes: the dpo stage's step (``PairScorer`` under the stage's autocast, then
``guarded_step``) on SmolLM2 with LoRA, timed with the default attention kernel and with the math backend, in
bf16-mixed and fp32, then one bf16-mixed step under ``torch.profiler`` (its ops by their own CPU time).

    .venv/bin/python bench/dpo_step_profile.py --project DIR   # DIR: as dpo_vs_trl.py --model smollm2 built it
"""

import argparse
import contextlib
import os
import time
from pathlib import Path

import torch
from dpo_vs_trl import COMMON, SETTINGS, _scorer, drawn_rows
from harness import real_overrides
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.trainable import autocast, trainable_policy
from tasks.common.training import adamw_with_cosine, guarded_step
from tasks.params.load import load_params


def main(project: Path, threads: int) -> None:
    torch.set_num_threads(threads)
    os.chdir(project)  # the stage's paths (artifacts/...) are relative to the project
    dpo = {**COMMON, **SETTINGS["smollm2"], "dpo.max_steps": 8}
    params = load_params(project / "params.yaml", [*real_overrides(), *(f"{k}={v}" for k, v in dpo.items())])
    cfg = params.dpo
    scorer, pairs, _ = _scorer(project, "train", params)
    model = trainable_policy(project / "artifacts/sft_cold", torch.device("cpu"), cfg).train()
    optimizer, _ = adamw_with_cosine(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps, 8)
    batches = drawn_rows(len(pairs), 8, params)

    def step(rows: list[int], precision: str, backend: SDPBackend | None) -> tuple[float, float]:
        started = time.perf_counter()
        with autocast(model, precision), sdpa_kernel(backend) if backend else contextlib.nullcontext():
            losses = scorer(model, rows)[0]
        forward = time.perf_counter()
        guarded_step(model, optimizer, losses.mean(), cfg.grad_clip, "bench step")
        return forward - started, time.perf_counter() - forward

    step(batches[0], cfg.precision, None)  # warm-up
    variants = [("bf16-mixed", None), ("bf16-mixed", SDPBackend.MATH), ("fp32", None)] * 2
    for index, (precision, backend) in enumerate(variants):
        forward, backward = step(batches[1 + index % 6], precision, backend)
        kernel = "math" if backend else "default"
        print(f"{precision:10s} attention {kernel:7s} forward {forward:.2f} s, backward and step {backward:.2f} s")
    with torch.profiler.profile() as profile:
        step(batches[7], "bf16-mixed", None)
    print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    main(arguments.project.resolve(), arguments.threads)
