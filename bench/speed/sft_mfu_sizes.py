"""SFT's MFU by model width: what the default model's small matmuls cost against the machine's matmul peak.

A scratch clone builds the default data, then for each width a base model (``base.hidden_size`` h,
``intermediate_size`` 4h, heads of 24 dimensions, the default's 3 layers) and ``alignflow stage sft`` for
``--steps`` steps at the default batch, and reads the stage's own ``metrics/sft/perf.json``: parameters, real
(unpadded) tokens per second and MFU against the fp32 matmul peak measured on this machine
(``tasks/common/flops.py``). The widths run one after another, so the machine's drift between them is in the
numbers; the trend, not the third digit, is the result.

    .venv/bin/python -m bench.speed.sft_mfu_sizes [--steps N] [--widths 96 192 384]
"""

import argparse
import json
import tempfile
from pathlib import Path

from bench.harness import clone, stage

HEAD_DIM = 24  # the default model's (96 / 4 heads)


def main(steps: int, widths: list[int]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        project = Path(scratch) / "project"
        clone(project)
        stage(project, "data")
        rows = []
        for width in widths:
            shape = [f"base.hidden_size={width}", f"base.intermediate_size={4 * width}"]
            stage(project, "base", *shape, f"base.num_heads={width // HEAD_DIM}")
            stage(project, "sft", f"sft.max_steps={steps}", f"sft.save_every={steps + 1}")
            perf = json.loads((project / "metrics/sft/perf.json").read_text())
            rows.append((width, perf))
            print(f"hidden {width}: {perf}", flush=True)
    print(f"\nSFT, {steps} steps at the default batch; MFU = 6 x parameters x real tokens/s / fp32 matmul peak")
    print(f"  {'hidden':>6} {'parameters':>11} {'tokens/s':>9} {'MFU':>6}")
    for width, perf in rows:
        print(f"  {width:>6} {perf['parameters']:>11,} {perf['tokens_per_second']:>9,.0f} {perf['mfu']:>6.3f}")
    print(f"  (peak {rows[0][1]['matmul_peak_gflops']} GFLOP/s; the issue's bar: 0.7 at the default width, 96)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--widths", type=int, nargs="+", default=[96, 192, 384])
    arguments = parser.parse_args()
    main(arguments.steps, arguments.widths)
