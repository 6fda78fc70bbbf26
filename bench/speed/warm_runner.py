"""What the warm stage runner saves (``flows/warm_runner.py``): ``alignflow repro PIPELINE`` in fresh clones of this
repo's HEAD, with its stages forked from the runner (warm, the default) and as processes of their own (cold,
``ALIGNFLOW_WARM_RUNNER=off``), the two legs alternating, their order rotated each round, side by side in one run.
Both legs' ``dvc.lock`` output hashes are checked equal: the runner changes the time, not the bits.

    .venv/bin/python -m bench.speed.warm_runner [--pipeline sft] [--rounds 2] [ARG ...]   # ARG: KEY=VALUE or @file
"""

import argparse
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from bench.harness import clone, project_env

LEGS = {"cold": {"ALIGNFLOW_WARM_RUNNER": "off"}, "warm": {}}


def leg(project: Path, pipeline: str, args: list[str], env: dict[str, str]) -> tuple[float, int, dict]:
    """Seconds of ``alignflow repro`` in a fresh clone at ``project``, the stages it ran, and its outputs' hashes."""
    clone(project)
    started = time.perf_counter()
    result = subprocess.run(
        ["alignflow", "repro", pipeline, *args, "remote.push=false"],
        cwd=project,
        env={**project_env(project), **env},
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"alignflow repro {pipeline} failed in {project}:\n{result.stderr[-3000:]}")
    stages = len(re.findall(r"Running stage '", result.stdout + result.stderr))
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    return seconds, stages, {name: entry.get("outs") for name, entry in lock.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", default="sft")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("args", nargs="*", help="overrides or @files for alignflow repro")
    options = parser.parse_args()
    seconds: dict[str, list[float]] = {name: [] for name in LEGS}
    outputs, stages = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(options.rounds):
            order = list(LEGS) if round_ % 2 == 0 else list(reversed(LEGS))
            for name in order:
                project = Path(scratch) / f"{name}-{round_}"
                took, stages[name], outputs[name] = leg(project, options.pipeline, options.args, LEGS[name])
                seconds[name].append(took)
                print(f"round {round_ + 1} {name}: {took:.1f} s, {stages[name]} stages", flush=True)
    assert outputs["cold"] == outputs["warm"], "the warm leg's outputs differ from the cold leg's"
    cold, warm = statistics.median(seconds["cold"]), statistics.median(seconds["warm"])
    print(f"\nalignflow repro {options.pipeline} {' '.join(options.args)}: median of {options.rounds} rounds")
    print(f"cold {cold:.1f} s, warm {warm:.1f} s: {cold / warm:.2f}x, {(cold - warm) / stages['warm']:.1f} s a stage")
    print("outputs: the same hashes in both legs")


if __name__ == "__main__":
    main()
