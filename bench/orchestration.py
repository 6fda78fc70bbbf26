"""Orchestration overhead: the default pipeline run three ways, side by side, in one go.

  direct   each stage's command in dependency order, nothing around it
  dvc      `dvc repro` of the pipeline's final stages (`alignflow repro sft`)
  prefect  `alignflow run sft`: a Prefect flow, every stage on Ray, DVC recording the lock

Each leg runs in its own fresh clone of this repo's HEAD, so every leg does the
same work from nothing. A Prefect server is started first and not timed (it is
infrastructure a deployment has running already); Ray start-up is timed. This
machine's speed drifts (steal time), so legs run in rounds, each round in a
rotated order, and the median per leg is compared.

    .venv/bin/python bench/orchestration.py [--rounds N] [KEY=VALUE ...]   # optional param overrides
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flows.catalog import PIPELINES
from flows.local_server import local_prefect_server

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def clone(destination: Path, overrides: list[str]) -> Path:
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(destination)], check=True)
    if overrides:
        from omegaconf import OmegaConf

        params = OmegaConf.merge(OmegaConf.load(destination / "params.yaml"), OmegaConf.from_dotlist(overrides))
        OmegaConf.save(params, destination / "params.yaml")
    return destination


def timed(command: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def stage_commands(project: Path) -> list[str]:
    from flows.runner import read_dag

    return [stage.cmd for stage in read_dag(project, PIPELINES["sft"].targets)]


def main(rounds: int, overrides: list[str]) -> None:
    times: dict[str, list[float]] = {"direct": [], "dvc": [], "prefect": []}
    with tempfile.TemporaryDirectory() as scratch, local_prefect_server(Path(scratch) / "prefect", ENV) as prefect_env:
        scratch = Path(scratch)
        commands = stage_commands(clone(scratch / "dag", overrides))
        targets = PIPELINES["sft"].targets

        def direct(project: Path) -> float:
            return sum(timed(["sh", "-c", command], project, ENV) for command in commands)

        legs = {
            "direct": direct,
            "dvc": lambda project: timed([sys.executable, "-m", "dvc", "repro", *targets], project, ENV),
            "prefect": lambda project: timed(["alignflow", "run", "sft"], project, prefect_env),
        }
        order = list(legs)
        for round_number in range(rounds):
            for leg in order[round_number % 3 :] + order[: round_number % 3]:
                seconds = legs[leg](clone(scratch / f"{leg}-{round_number}", overrides))
                times[leg].append(seconds)
                print(f"round {round_number + 1}: {leg:<8} {seconds:7.1f} s", flush=True)
    medians = {leg: statistics.median(samples) for leg, samples in times.items()}
    settings = f": {' '.join(overrides)}" if overrides else ""
    print(f"default pipeline, {len(commands)} stages, median of {rounds} round(s){settings}")
    for leg, seconds in medians.items():
        print(f"  {leg:<8} {seconds:7.1f} s   {seconds / medians['direct']:.3f}x direct")
    overhead = medians["prefect"] / medians["direct"] - 1
    print(f"orchestration overhead of Prefect + Ray + DVC: {overhead:+.1%} (target: under +10%)")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    rounds = 1
    if arguments[:1] == ["--rounds"]:
        rounds, arguments = int(arguments[1]), arguments[2:]
    main(rounds, arguments)
