"""Model FLOPs utilisation (MFU): the FLOPs a model's training spends on its tokens, 6 x parameters per token
(2 forward, 4 backward; attention's own FLOPs uncounted, as usual), over the fp32 matmul peak of the machine the
stage runs on, measured there: the peak moves with the CPU, its thread count and its neighbours.

The peak is measured once per machine, torch version and thread count (about a second) and kept in the user's
cache directory, so stages do not pay for it on every run.
"""

import json
import platform
import time
from pathlib import Path

import torch

from tasks.common.artifacts import USER_CACHE, atomic_output

PEAK_SIZES = (1024, 2048)  # square matmuls; the best rate of any is the peak
PEAK_CACHE = USER_CACHE / "matmul_peak.json"


def measure_matmul_peak(threads: int, seconds_per_size: float = 0.25, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s: the best rate of repeated ``a @ b`` in ``dtype`` over ``PEAK_SIZES``, on ``threads`` threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best = 0.0
        for n in PEAK_SIZES:
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            a @ b  # warm-up
            flops, spent = 0.0, 0.0
            while spent < seconds_per_size:
                started = time.perf_counter()
                a @ b
                spent += time.perf_counter() - started
                flops += 2 * n**3
            best = max(best, flops / spent)
        return best
    finally:
        torch.set_num_threads(previous)


def matmul_peak(threads: int) -> float:
    """This machine's fp32 matmul peak on ``threads`` threads, in FLOP/s: measured on first use, then cached."""
    key = f"{platform.node()}|{platform.machine()}|{_cpu_model()}|torch {torch.__version__}|{threads} threads"
    try:
        cached = json.loads(PEAK_CACHE.read_text())
    except (OSError, ValueError):
        cached = {}
    if key not in cached:
        cached[key] = measure_matmul_peak(threads)
        try:
            PEAK_CACHE.parent.mkdir(parents=True, exist_ok=True)
            with atomic_output(PEAK_CACHE, with_the_stage=False) as temporary:
                temporary.write_text(json.dumps(cached, indent=1))
        except OSError:
            pass  # a read-only home: measure again next time
    return cached[key]


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


def mfu(parameters: int, tokens: float, seconds: float, threads: int, workers: int = 1) -> float:
    """Model FLOPs utilisation of training ``parameters`` on ``tokens`` real tokens in ``seconds``, on ``workers``
    processes of ``threads`` threads each."""
    return 6 * parameters * tokens / seconds / (matmul_peak(threads) * workers)
