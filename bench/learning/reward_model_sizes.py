"""The Bradley-Terry classifier reward model's accuracy against the size of its backbone, on labels as noisy as the
default and on noise-free ones.

For each size the reward backbone is built and fine-tuned on the task (stage ``reward_backbone``), then a reward
model is trained from it (stage ``reward_model``) on preference pairs sampled from PPO's start and labelled by the
judge, with the default label noise and without; held-out ``accuracy`` is against the judge's noise-free order.
Everything runs through the real stages in a scratch clone, with the default params but for the size.

    python -m bench.learning.reward_model_sizes                       # the table in docs/rlhf.md
    python -m bench.learning.reward_model_sizes --sizes 64x2 96x3     # some of it
"""

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from safetensors.torch import load_file

from bench.harness import cold_start_project, stage

# name: (hidden_size, num_layers, num_heads, intermediate_size); 96x3 is the policy's own size
SIZES = {"64x2": (64, 2, 4, 256), "96x3": (96, 3, 4, 384), "192x6": (192, 6, 6, 768), "256x8": (256, 8, 8, 1024)}
NOISE = {"default noise": [], "noise-free": ["preferences.judge.label_noise=0"]}
# The Bradley-Terry classifier on a backbone of its own, as the table in docs/rlhf.md measured it.
CLASSIFIER = ["reward_model.kind=classifier", "reward_model.backbone=reward_backbone"]
CLASSIFIER += ["reward_model.lr=3e-4", "reward_model.epochs=4"]


def size_overrides(name: str) -> list[str]:
    hidden, layers, heads, intermediate = SIZES[name]
    return [
        f"reward_backbone.hidden_size={hidden}",
        f"reward_backbone.num_layers={layers}",
        f"reward_backbone.num_heads={heads}",
        f"reward_backbone.intermediate_size={intermediate}",
    ]


def timed(project: Path, *args: str) -> float:
    started = time.perf_counter()
    stage(project, *args)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["64x2", "96x3", "192x6"], choices=list(SIZES))
    args = parser.parse_args()
    parameters: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as scratch:
        project = cold_start_project(Path(scratch) / "project")
        backbones = Path(scratch) / "backbones"
        # Each line as soon as it is measured: the largest size takes the better part of an hour here.
        print(f"{'size':>6} {'parameters':>10} {'stage':>16} {'labels':>14} {'accuracy':>9} {'seconds':>8}", flush=True)
        for size in args.sizes:
            seconds = timed(project, "reward_backbone", *size_overrides(size))
            weights = load_file(project / "artifacts/reward_backbone/model.safetensors")
            parameters[size] = sum(tensor.numel() for tensor in weights.values())
            shutil.copytree(project / "artifacts/reward_backbone", backbones / size)
            print(
                f"{size:>6} {parameters[size]:>10} {'reward_backbone':>16} {'':>14} {'':>9} {seconds:>8.0f}", flush=True
            )
        for noise, overrides in NOISE.items():
            stage(project, "preferences", *overrides)
            for size in args.sizes:
                shutil.rmtree(project / "artifacts/reward_backbone")
                shutil.copytree(backbones / size, project / "artifacts/reward_backbone")
                seconds = timed(project, "reward_model", *CLASSIFIER, *overrides)
                accuracy = json.loads((project / "metrics/reward_model/metrics.json").read_text())["accuracy"]
                cells = f"{'reward_model':>16} {noise:>14} {accuracy:>9.3f} {seconds:>8.0f}"
                print(f"{size:>6} {parameters[size]:>10} {cells}", flush=True)


if __name__ == "__main__":
    main()
