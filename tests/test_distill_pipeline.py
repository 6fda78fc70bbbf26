"""The distillation pipeline end to end on a tiny configuration: teacher (R1's grpo) -> its verified samples ->
a student a third its size -> SFT -> on-policy distillation -> eval, with the teacher untouched throughout."""

import hashlib
import json
import subprocess

import pytest
import torch
import yaml

from tasks.data.datasets import read_examples
from tasks.data.problems import score_response
from tests.conftest import dvc, make_project, report_json, repro, resume_after_kill, stages_run, warm
from tests.test_r1_pipeline import EASY

pytestmark = pytest.mark.slow

STAGES = {
    *("data", "base", "sft_cold", "grpo", "teacher_data", "student_base", "sft_distill", "distill"),
    *("eval@grpo", "eval@student_base", "eval@sft_distill", "eval@distill"),
}
MODELS = ("grpo", "student_base", "sft_distill", "distill")


def _digest(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def distill(tmp_path_factory) -> dict:
    path = make_project(tmp_path_factory.mktemp("distill"), (*EASY, "teacher_data.num_prompts=48"))
    output = repro(path, "distill")
    return {"path": path, "output": output, "weights": (path / "artifacts/distill/model.safetensors").read_bytes()}


def test_the_pipeline_runs_every_stage_and_reports_each_models_size_beside_its_pass_rate(distill):
    path = distill["path"]
    assert stages_run(distill["output"]) == STAGES
    report = report_json(path)
    assert [stage for stage in report if stage in MODELS] == list(MODELS)  # pipeline order
    for model in MODELS:
        assert {"num_parameters", "pass@1", "pass@k"} <= set(report[model]), model
    teacher, student = report["grpo"]["num_parameters"], report["student_base"]["num_parameters"]
    assert report["sft_distill"]["num_parameters"] == report["distill"]["num_parameters"] == student
    assert student <= teacher / 3
    assert report["student_base"]["fraction_of_teacher"] == pytest.approx(student / teacher, abs=1e-4)
    monitored = {f"train/{name}" for name in ("divergence", "policy_loss", "entropy", "logprob_parity", "accuracy")}
    assert monitored <= set(report["distill"])


def test_the_teacher_data_holds_only_verified_responses_with_its_acceptance_rate(distill):
    path = distill["path"]
    rows = read_examples(path / "artifacts/teacher_data/train.jsonl")
    report = report_json(path)["teacher_data"]
    assert len(rows) == report["accepted"] > 0 and 0 < report["acceptance_rate"] <= 1
    assert all(score_response(row, row.solution) == (True, True) for row in rows)


def test_dvc_lock_names_the_teacher_behind_every_distillation_stage(distill):
    lock = yaml.safe_load((distill["path"] / "dvc.lock").read_text())["stages"]
    teacher_hash = next(out["md5"] for out in lock["grpo"]["outs"] if out["path"] == "artifacts/grpo")
    for stage in ("student_base", "teacher_data", "distill"):
        deps = {dep["path"]: dep["md5"] for dep in lock[stage]["deps"]}
        assert deps["artifacts/grpo"] == teacher_hash, stage
        assert lock[stage]["params"]["params.yaml"]["distill.teacher" if stage != "distill" else "distill"]
    assert lock["distill"]["params"]["params.yaml"]["distill"]["teacher"] == "grpo"


def test_gkd_with_teacher_batches_runs_as_a_stage_and_leaves_the_teacher_alone(distill):
    path = distill["path"]
    assert "grpo" not in dvc(path, "status", "grpo")  # the pipeline's distillation left the teacher as grpo wrote it
    before, params = _digest(path / "artifacts/grpo/model.safetensors"), (path / "params.yaml").read_bytes()
    result = subprocess.run(
        ["alignflow", "stage", "distill", "distill.distill_loss=gkd", "distill.lmbda=0.5", "distill.jsd_beta=0.3"],
        cwd=path,
        env=warm(),
        capture_output=True,
        text=True,
    )
    (path / "params.yaml").write_bytes(params)  # the overrides stuck: the tests after this one run the default loss
    assert result.returncode == 0, result.stderr
    assert _digest(path / "artifacts/grpo/model.safetensors") == before
    offline = (path / "metrics/distill/plots/metrics/train/offline_batch.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in offline[1:]] == ["1", "3"]  # iterations 0 and 2 of 4, logged at steps 1, 3


def test_the_verifier_guard_keeps_the_start_when_a_weaker_teacher_pulls_the_student_down(distill):
    """Distilled toward the untrained base model, which answers nothing, a student (grpo here, the strongest model
    of the project) loses what the verifier credits. With guard.signal=verifier (the student is not trained on the
    verifier) the artifact is the iteration the verifier rates best, a later one only when its probe is better by a
    standard error of the paired difference (guard.min_z=1): the start here, the student's weights bit for bit."""
    from safetensors.torch import load_file

    path = distill["path"]
    params = (path / "params.yaml").read_bytes()
    weaker = (
        "distill.init=grpo",
        "distill.teacher=base",
        "distill.temperature=0.1",
        "distill.actor_lr=5e-3",
        "distill.steps=6",
    )
    guarded = (
        "distill.guard.signal=verifier",
        "distill.guard.every=2",
        "distill.guard.prompts=48",
        "distill.guard.min_z=1",
    )
    result = subprocess.run(
        ["alignflow", "stage", "distill", *weaker, *guarded], cwd=path, env=warm(), capture_output=True, text=True
    )
    (path / "params.yaml").write_bytes(params)
    assert result.returncode == 0, result.stderr
    guard = json.loads((path / "artifacts/distill/guard.json").read_text())
    probes = {probe["step"]: probe["guard/score"] for probe in guard["probes"]}
    assert guard["signal"] == "verifier" and list(probes) == [0, 2, 4, 6]
    assert probes[0] > probes[6] + 0.1 and guard["kept_iteration"] == 0, guard
    kept, start = (load_file(path / f"artifacts/{model}/model.safetensors") for model in ("distill", "grpo"))
    assert kept.keys() == start.keys() and all(torch.equal(kept[name], start[name]) for name in kept)


def test_distill_killed_mid_run_resumes_to_identical_weights(distill):
    path = distill["path"]
    dvc(path, "repro", "--force", "--single-item", "distill")  # the default loss again, after the gkd run above
    assert "distill: resuming from the checkpoint at step 2" in resume_after_kill("distill", path)
    assert (path / "artifacts/distill/model.safetensors").read_bytes() == distill["weights"]


def test_the_teacher_runs_on_a_ray_actor_of_its_own_when_not_colocated(distill, monkeypatch):
    import ray
    import torch

    from models import load_tokenizer
    from tasks.common.artifacts import DATA_DIR, model_dir
    from tasks.params.load import load_params
    from tasks.rl.distillation import distill_roles, learn_distillation
    from tasks.rl.learner import LoopState
    from tasks.rl.placement import place
    from tasks.rl.rewards import RewardScorer
    from tasks.rl.trainer import collect

    monkeypatch.chdir(distill["path"])
    params = load_params("params.yaml", ["distill.colocate=false"])
    cfg = params.distill
    try:
        roles = place(params, cfg, model_dir(cfg.init), [], distill_roles(cfg), model_dir(cfg.teacher))
        assert roles.teacher.remote and roles.actor.remote
        teacher = roles.teacher.weights().result()
        examples, tokenizer = read_examples(DATA_DIR / "train.jsonl"), load_tokenizer(model_dir(cfg.init))
        state, clock = LoopState(), dict.fromkeys(("time/generate", "time/score", "time/train"), 0.0)
        with RewardScorer(cfg.rewards, cfg.reward_timeout_seconds) as scorer:
            for _ in range(2):
                rollout, _ = collect(roles, scorer, examples, cfg, state, params.seed, clock)
                metrics = learn_distillation(roles, rollout, tokenizer, cfg, state, clock)
        assert metrics["divergence"] > 0
        after = roles.teacher.weights().result()
        assert all(torch.equal(teacher[name], after[name]) for name in teacher)
    finally:
        ray.shutdown()
