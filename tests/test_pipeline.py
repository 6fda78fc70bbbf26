"""The default pipeline end to end through `dvc repro`, on a tiny configuration (minutes, not seconds).

Each project is a fresh copy of the repo's tracked files with smaller params, as a user's clone would be.
"""

import json
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from models import num_parameters
from tasks.pipelines import PIPELINES
from tests.conftest import ENV, kill_at_first_checkpoint, lock_entries, make_project, repro, stages_run

pytestmark = pytest.mark.slow


def test_pipeline_runs_every_stage_and_reports_in_order(uninterrupted):
    assert stages_run(uninterrupted["output"]) == {"data", "base", "sft", "eval@base", "eval@sft"}
    result = subprocess.run(
        ["alignflow", "report", "--json"], cwd=uninterrupted["path"], env=ENV, capture_output=True, text=True
    )
    report = json.loads(result.stdout)
    assert list(report) == ["data", "base", "sft"]
    for model in ("base", "sft"):
        assert {"pass@1", "pass@k", "format_rate", "response_length"} <= set(report[model])
    # The training curve is a dvclive plot (what `dvc plots show` draws), and it goes down.
    curve = (uninterrupted["path"] / "metrics/sft/plots/metrics/train/loss.tsv").read_text().split()
    assert curve[:2] == ["step", "loss"]
    losses = [float(v) for v in curve[3::2]]
    assert len(losses) == 12 and losses[-1] < 0.75 * losses[0]
    assert report["sft"]["train/loss"] == losses[-1]
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (uninterrupted["path"] / "artifacts/sft" / name).is_file()


def test_sft_reports_its_throughput_and_mfu_beside_the_lock_not_in_it(uninterrupted):
    project = uninterrupted["path"]
    perf = json.loads((project / "metrics/sft/perf.json").read_text())
    assert perf["parameters"] == num_parameters(project / "artifacts/sft")
    # MFU: 6 x parameters x real tokens per second over the machine's measured fp32 matmul peak
    expected = 6 * perf["parameters"] * perf["tokens_per_second"] / (perf["matmul_peak_gflops"] * 1e9)
    assert 0 < perf["mfu"] < 1.5 and perf["mfu"] == pytest.approx(expected, rel=2e-3)
    shown = json.loads(
        subprocess.run(
            ["dvc", "metrics", "show", "--json"], cwd=project, env=ENV, capture_output=True, text=True, check=True
        ).stdout
    )
    assert any("metrics/sft/perf.json" in run.get("data", {}) for run in shown.values())
    assert "perf.json" not in (project / "dvc.lock").read_text()  # wall-clock: a rerun's lock stays the same
    untracked = subprocess.run(["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True).stdout
    assert "perf.json" not in untracked


def test_same_params_and_seed_give_identical_lock_hashes(uninterrupted, tmp_path):
    twin = make_project(tmp_path)
    repro(twin)
    assert lock_entries(twin) == uninterrupted["lock"]


def test_kill_during_sft_then_repro_resumes_to_identical_weights(uninterrupted, tmp_path):
    path = make_project(tmp_path)
    checkpoints = path / ".alignflow/checkpoints/sft"
    kill_at_first_checkpoint([sys.executable, "-m", "dvc", "repro", *PIPELINES["sft"].targets], path, checkpoints)
    assert not (path / "artifacts/sft").exists(), "a killed stage must leave no output"

    output = repro(path)
    assert "sft: resuming from the checkpoint at step" in output
    assert (path / "artifacts/sft/model.safetensors").read_bytes() == uninterrupted["weights"]
    assert lock_entries(path) == uninterrupted["lock"]
    assert not checkpoints.exists(), "checkpoints are cleared once the stage succeeds"


def test_second_repro_skips_every_stage(uninterrupted):
    start = time.monotonic()
    output = repro(uninterrupted["path"])
    print(f"no-op dvc repro took {time.monotonic() - start:.1f}s")
    assert stages_run(output) == set()


def test_changing_an_eval_param_reruns_only_eval(uninterrupted):
    path = uninterrupted["path"]
    params = OmegaConf.load(path / "params.yaml")
    params.eval.temperature = 0.7
    OmegaConf.save(params, path / "params.yaml")
    assert stages_run(repro(path)) == {"eval@base", "eval@sft"}
