"""This machine's matmul peak (``tasks/common/flops.py``'s measure, taken afresh): the best rate of square
matmuls, per thread count, in float32 (what MFU divides a stage's 6 x parameters x tokens per second by) and in
bfloat16 beside it, with the ratio and what ``precision: auto`` makes of this CPU (``models.trainable.native_bf16``).

    .venv/bin/python -m bench.speed.matmul_peak
"""

import torch

from models.trainable import native_bf16
from tasks.common.flops import measure_matmul_peak


def main() -> None:
    native = native_bf16(torch.device("cpu"))
    print(
        f"bfloat16 native on this CPU (AMX or AVX-512 BF16): {native}; precision auto is {'bf16' if native else 'fp32'}"
    )
    for threads in sorted({1, torch.get_num_threads()}):
        fp32 = measure_matmul_peak(threads)
        bf16 = measure_matmul_peak(threads, dtype=torch.bfloat16)
        print(
            f"{threads} thread(s): fp32 {fp32 / 1e9:.1f} GFLOP/s, bf16 {bf16 / 1e9:.1f} GFLOP/s "
            f"(bf16 {bf16 / fp32:.2f}x fp32)"
        )


if __name__ == "__main__":
    main()
