"""This machine's fp32 matmul peak: the best rate of square matmuls of a few sizes, per thread count.

MFU (model FLOPs utilisation) divides a stage's 6 x parameters x tokens per second by this number; it is measured
where the stage runs, because the peak moves with the CPU (and with its neighbours on a shared machine).

    .venv/bin/python bench/matmul_peak.py
"""

import time

import torch

SIZES = (256, 512, 1024, 2048)


def matmul_peak(threads: int, seconds_per_size: float = 0.5) -> float:
    """FLOP/s: the best of each size's rate over about ``seconds_per_size`` of repeated ``a @ b``."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best = 0.0
        for n in SIZES:
            a, b = torch.randn(n, n), torch.randn(n, n)
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


def main() -> None:
    for threads in sorted({1, torch.get_num_threads()}):
        print(f"fp32 matmul peak, {threads} thread(s): {matmul_peak(threads) / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
