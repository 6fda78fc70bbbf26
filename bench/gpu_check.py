"""The real-model pipeline on a CUDA device, as GPU users run it: SmolLM2-135M-Instruct through base -> sft_cold
(LoRA, bf16-mixed) -> grpo (LoRA, bf16-mixed, the vLLM engine colocated in sleep mode) -> eval@grpo, printing each
stage's wall-clock, GRPO's phases, its update tokens/s and MFU against this GPU's measured bf16 matmul peak, and
held-out pass@1.

    .venv/bin/python bench/gpu_check.py              # needs a CUDA GPU and vLLM's GPU build (pip install vllm)
    .venv/bin/python bench/gpu_check.py --steps 20

The stages' own perf.json measure MFU against the CPU's fp32 peak (tasks/common/flops.py); on a GPU this script's
figure, against the GPU's bf16 peak, is the one to read. docs/real-models.md records what it printed, and where.
"""

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from gpu_lean import matmul_peak
from harness import ENV, REPO, stage

OVERLAY = REPO / "examples/smollm2.args"
ON_A_GPU = (
    "device=cuda",
    "grpo.rollout_backend=vllm",
    "grpo.vllm.sleep_mode=true",  # colocated: the engine sleeps through each update
    "grpo.vllm.gpu_memory_utilization=0.3",
    "sft_cold.max_steps=100",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="GRPO iterations")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device is visible; this check runs on a GPU")
    overrides = [f"@{OVERLAY}", *ON_A_GPU, f"grpo.steps={args.steps}"]
    peak = matmul_peak(torch.device("cuda"))
    with tempfile.TemporaryDirectory() as scratch:
        project = Path(scratch) / "project"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(project)], check=True, env=ENV)
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


if __name__ == "__main__":
    main()
