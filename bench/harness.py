"""The benches' shared harness: a scratch clone of this repo, its stages run by this environment's ``alignflow``,
the real model's project (SmolLM2-135M-Instruct through ``examples/smollm2.args``), and the separate environment TRL
runs in.

Every bench runs as a module from the repository root, ``.venv/bin/python -m bench.GROUP.NAME``, so the root is
first on ``sys.path`` and a bench imports this module one way: ``from bench.harness import ...``. The TRL legs run
the same way in TRL's environment (``run_trl_leg``), with this checkout on their ``PYTHONPATH``.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import venv
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
# dvc.yaml's commands and the benches call `alignflow`: the one installed beside this Python
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
# The peer's environment, apart from the project's, so TRL never enters it (made on first use).
TRL_ENV = REPO / ".bench" / "trl"
TRL_PACKAGES = ["torch==2.13.0", "transformers==5.19.0", "tokenizers==0.23.3", "trl==1.16.0", "peft==0.21.2"]
# The real model's recipe (docs/real-models.md): SmolLM2-135M-Instruct, 2-digit additions through its chat template,
# LoRA in bf16-mixed; a params overlay, a KEY=VALUE line each.
OVERLAY = "examples/smollm2.args"


def set_threads(threads: int) -> None:
    """Every leg on ``threads`` threads: this process's torch and the processes it starts (stages, TRL)."""
    os.environ["OMP_NUM_THREADS"] = ENV["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def clone(project: Path) -> Path:
    """A scratch clone of this repo's HEAD at ``project``."""
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(project)], check=True)
    return project


def project_env(project: Path) -> dict[str, str]:
    """The environment of a command run in the clone ``project``: this environment's ``alignflow``, importing the
    clone's code first. The install is this checkout's, editable: without it a run would take up whatever this
    checkout holds when each stage starts, edits made while the bench runs included."""
    return {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, (str(project), ENV.get("PYTHONPATH"))))}


def stage(project: Path, *args: str) -> None:
    """``alignflow stage <args>`` in ``project``; its progress output is dropped."""
    command = ["alignflow", "stage", *args]
    subprocess.run(command, cwd=project, env=project_env(project), check=True, stdout=subprocess.DEVNULL)


def _status_kib(field: str) -> int:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
    return int(line.split()[1])


def peak_mib(run) -> float:
    """The peak MiB this process held while ``run()`` ran, above what it held before (Linux: the peak resident set
    is reset through ``/proc/self/clear_refs`` first)."""
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    run()
    return (_status_kib("VmHWM") - before) / 1024


def overlay() -> list[str]:
    """The overrides of the real model's recipe (``OVERLAY``), as ``alignflow stage @OVERLAY`` reads them."""
    lines = (line.strip() for line in (REPO / OVERLAY).read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def built_project(project: Path, stages: list[str] | tuple[str, ...], overrides: list[str]) -> Path:
    """A clone of this repo at ``project`` with the artifacts of ``stages`` (in order), each built with ``overrides``:
    a project made by an earlier run is reused, its missing stages built. ``project/bench-project.json`` records the
    overrides it was built with; reusing it with others is an error (its artifacts would belong to other params)."""
    record = project / "bench-project.json"
    if not project.exists():
        clone(project)
        record.write_text(json.dumps({"overrides": overrides}, indent=1))
    elif not record.is_file() or json.loads(record.read_text())["overrides"] != overrides:
        raise SystemExit(f"{project}: built by another bench or with other params than {overrides}; pick another")
    for name in stages:
        if not (project / "artifacts" / name).exists():
            print(f"building {project}: alignflow stage {name}", flush=True)
            stage(project, name, *overrides)
    return project


COLD_START = ("data", "base", "sft_cold")  # the stages up to the cold-start SFT model, RL's starting policy
PREFERENCES = ("preferences", "dpo_reference")  # then its preference pairs and their reference log-probs


def cold_start_project(project: Path, overrides: list[str] | tuple[str, ...] = ()) -> Path:
    """Clone this repo to ``project`` and build its data, base model and cold-start SFT model there."""
    clone(project)
    for name in COLD_START:
        stage(project, name, *overrides)
    return project


def trl_python() -> Path:
    """The Python of a virtual environment with TRL, made under ``.bench/`` on first use."""
    python, installed = TRL_ENV / "bin" / "python", TRL_ENV / "bench-packages.txt"
    if not python.exists():
        print(f"making {TRL_ENV} with {' '.join(TRL_PACKAGES)} (once)", flush=True)
        venv.create(TRL_ENV, with_pip=True)
    if not installed.is_file() or installed.read_text().split() != TRL_PACKAGES:
        # torch first, pinned, so that nothing after it pulls in another build of it
        subprocess.run([python, "-m", "pip", "install", "--quiet", TRL_PACKAGES[0]], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", *TRL_PACKAGES], check=True)
        installed.write_text("\n".join(TRL_PACKAGES) + "\n")
    return python


def side_by_side_parser(doc: str, steps_help: str) -> argparse.ArgumentParser:
    """The options the benches against TRL share: the model, each leg's steps, threads, and the project to reuse."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--steps", type=int, help=steps_help)
    parser.add_argument("--threads", type=int, help="torch threads of every leg (default: OMP_NUM_THREADS's)")
    parser.add_argument("--project", type=Path, help="the project to build once and reuse (default: a scratch one)")
    return parser


def run_trl_leg(leg: str, settings: dict, result: Path) -> dict:
    """Run ``bench.trl.<leg>`` in TRL's environment on ``settings``; what it wrote to ``result`` (JSON). Its working
    directory is ``result``'s folder, so anything the Trainer writes beside its output_dir lands there."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    command = [trl_python(), "-m", f"bench.trl.{leg}", json.dumps(settings), result]
    subprocess.run(command, cwd=result.parent, env=env, check=True)
    return json.loads(result.read_text())


def paired_gap(ours: list[bool], theirs: list[bool]) -> tuple[float, float]:
    """The rate of ``ours`` minus that of ``theirs`` on the same items, and that difference's standard error."""
    differences = [float(a) - float(b) for a, b in zip(ours, theirs, strict=True)]
    return statistics.mean(differences), statistics.stdev(differences) / math.sqrt(len(differences))


def against_bar(
    ratio: float, target: float, gap: float, error: float, tiny_tolerance: float | None
) -> tuple[str, float]:
    """Whether alignflow meets a bench's bar against a peer, "meets" or "misses", and the quality tolerance: at least
    ``target`` times the peer's speed, and a held-out score not below the peer's by more than ``tiny_tolerance`` (on
    the tiny model; None: by more than twice the paired standard error ``error`` of the gap)."""
    tolerance = 2 * error if tiny_tolerance is None else tiny_tolerance
    return ("meets" if ratio >= target and gap >= -tolerance else "misses"), tolerance


def synchronize() -> None:
    """Wait for the GPU's queued work, so that a clock read after it counts it (nothing to wait for on a CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def device_matmul_peak(device: torch.device, seconds: float = 1.0) -> float:
    """FLOP/s of repeated square matmuls: bf16 8192 on a GPU, fp32 1024 on a CPU (a dry run)."""
    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (1024, torch.float32)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn_like(a)
    a @ b
    synchronize()
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        count += 1
    synchronize()
    return count * 2 * size**3 / (time.perf_counter() - started)


# The real model's project, which the GRPO and DPO benches share (`--project DIR` builds it once, then reuses it):
# the recipe, with a held-out split of REAL_HELD_OUT problems (greedy pass@1 to about +-0.022 at 0.5; the paired
# difference of two models on the same problems, less) and preference pairs sampled from sft_cold on 200 training
# prompts and on every held-out one, 4 responses each, as long as GRPO's.
REAL_HELD_OUT = 500


def real_overrides() -> list[str]:
    """The params of the real model's project: the recipe's and the benches' own."""
    return [
        *overlay(),
        f"data.num_test={REAL_HELD_OUT}",
        "eval.batch_size=64",  # prompts (pairs, for dpo_reference) per batch: the memory of 64, not 256
        "preferences.num_prompts=200",
        "preferences.max_new_tokens=40",
    ]


def real_project(project: Path, stages: tuple[str, ...] = COLD_START) -> Path:
    """``built_project`` of the real model's ``stages`` at ``project``, with ``real_overrides``."""
    return built_project(project, stages, real_overrides())
