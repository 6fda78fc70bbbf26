"""The lent GPU machine's bench (``bench/gpu/run.sh``: ``bench.trl.grpo --model-config``) runs the shipped GRPO
iteration (placed roles, ``collect``, ``learn``) where the pipeline's own packages are absent, as they are there."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO, tiny_model

# Not on the lent GPU machine (it has torch, transformers, PEFT and accelerate; the wheels bring the rest)
ABSENT = ("ray", "dvc", "dvclive", "prefect", "gto", "vllm")


def site_without_pipeline_packages(path: Path) -> Path:
    """A site-packages of links to this environment's, less ``ABSENT``'s packages (and the editable install's hook:
    this checkout comes first on PYTHONPATH)."""
    path.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name
        absent = any(name == p or name.startswith((f"{p}-", f"{p}_")) for p in ABSENT)
        if not (absent or name.endswith(".pth") or name.startswith("__editable__")):
            (path / name).symlink_to(entry)
    return path


@pytest.mark.slow
def test_the_gpu_grpo_bench_runs_the_shipped_iteration_without_ray_dvc_dvclive_or_prefect(tmp_path):
    site = site_without_pipeline_packages(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{site}"}
    python = [sys.executable, "-S"]  # -S: no site-packages but the links above
    for package in ABSENT:
        missing = subprocess.run([*python, "-c", f"import {package}"], env=env, capture_output=True, text=True)
        assert "ModuleNotFoundError" in missing.stderr, package
    out = tmp_path / "result.json"
    bench = ["-m", "bench.trl.grpo", "--model-config", str(tiny_model(tmp_path / "model")), "--device", "cpu"]
    small = ["--steps", "2", "--prompts", "2", "--max-new-tokens", "8", "--legs", "alignflow", "--out", str(out)]
    ran = subprocess.run([*python, *bench, *small], cwd=REPO, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    leg = json.loads(out.read_text())["alignflow"]
    assert leg["timed_steps"] == 1 and leg["steps_per_second"] > 0
    # the stage's bf16-mixed: sampling from the merged bf16 copy, the update's passes under autocast
    assert leg["layer_output_dtype"] == {"sampling": "bfloat16", "training": "bfloat16"}
    assert {"policy_loss", "grad_norm", "mismatch_kl", "logprob_parity"} <= set(leg["last_step"])
