"""This machine's fp32 matmul peak (``tasks/common/flops.py``'s measure, taken afresh): the best rate of square
matmuls, per thread count. MFU divides a stage's 6 x parameters x tokens per second by it.

    .venv/bin/python -m bench.speed.matmul_peak
"""

import torch

from tasks.common.flops import measure_matmul_peak


def main() -> None:
    for threads in sorted({1, torch.get_num_threads()}):
        print(f"fp32 matmul peak, {threads} thread(s): {measure_matmul_peak(threads) / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
