"""What the warm stage runner saves (``flows/warm_runner.py``): ``alignflow repro PIPELINE`` (or ``alignflow run``, the
Prefect flow on Ray, against a Prefect server of the bench's own) in fresh clones of this repo's HEAD, with its
stages forked from the runner (warm, the default) and as processes of their own (cold, ``ALIGNFLOW_WARM_RUNNER=off``),
the two legs alternating, their order rotated each round, side by side in one run. Both legs' ``dvc.lock`` output
hashes are checked equal: the runner changes the time, not the bits.

    .venv/bin/python -m bench.speed.warm_runner [--command repro|run] [--pipeline sft] [--rounds 2] [ARG ...]
    # ARG: KEY=VALUE or @file
"""

import argparse
import contextlib
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from bench.harness import ENV, clone, project_env
from flows.local_server import local_prefect_server

LEGS = {"cold": {"ALIGNFLOW_WARM_RUNNER": "off"}, "warm": {}}


def leg(project: Path, command: list[str], env: dict[str, str]) -> tuple[float, int, dict]:
    """Seconds of ``command`` in a fresh clone at ``project``, the stages it ran (every stage of its dvc.lock, the
    clone being fresh), and its outputs' hashes."""
    clone(project)
    # no push: `alignflow run` takes only the stages' keys on its command line, so the clone's params.yaml says it
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["remote"]["push"] = False
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    started = time.perf_counter()
    result = subprocess.run(command, cwd=project, env={**project_env(project), **env}, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {project}:\n{result.stderr[-3000:]}")
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    return seconds, len(lock), {name: entry.get("outs") for name, entry in lock.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--command", choices=("repro", "run"), default="repro")
    parser.add_argument("--pipeline", default="sft")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("args", nargs="*", help="overrides or @files for alignflow repro (or run)")
    options = parser.parse_args()
    command = ["alignflow", options.command, options.pipeline, *options.args]
    seconds: dict[str, list[float]] = {name: [] for name in LEGS}
    outputs, stages = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        server = local_prefect_server(Path(scratch) / "prefect", ENV) if options.command == "run" else None
        with server or contextlib.nullcontext({}) as prefect:
            server_vars = {key: value for key, value in prefect.items() if key.startswith("PREFECT_")}
            for round_ in range(options.rounds):
                order = list(LEGS) if round_ % 2 == 0 else list(reversed(LEGS))
                for name in order:
                    project = Path(scratch) / f"{name}-{round_}"
                    took, stages[name], outputs[name] = leg(project, command, {**server_vars, **LEGS[name]})
                    seconds[name].append(took)
                    print(f"round {round_ + 1} {name}: {took:.1f} s, {stages[name]} stages", flush=True)
    assert outputs["cold"] == outputs["warm"], "the warm leg's outputs differ from the cold leg's"
    cold, warm = statistics.median(seconds["cold"]), statistics.median(seconds["warm"])
    print(f"\n{' '.join(command)}: median of {options.rounds} rounds")
    print(f"cold {cold:.1f} s, warm {warm:.1f} s: {cold / warm:.2f}x, {(cold - warm) / stages['warm']:.1f} s a stage")
    print("outputs: the same hashes in both legs")


if __name__ == "__main__":
    main()
