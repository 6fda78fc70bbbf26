"""The R1 and R1-Zero pipelines end to end on a tiny configuration, and the rejection-sampling rules."""

import json
import subprocess
import sys
import types

import pytest

from tasks.data.datasets import read_examples
from tasks.data.problems import Example, score_response
from tasks.params.load import load_params
from tasks.stages.rejection_sampling import accepted
from tests.conftest import ENV, dvc, make_project, repro, resume_after_kill, stages_run

R1_STAGES = {
    "data", "base", "sft", "preferences", "reward_model", "sft_cold", "grpo", "rejection@1",
    "sft_rs@1", "grpo_final@1",
    "eval@base", "eval@sft", "eval@sft_cold", "eval@grpo", "eval_sft_rs@1", "eval_grpo_final@1",
}  # fmt: skip
# 1-digit addition: easy enough that the test's tiny model is sometimes right, so rejection sampling keeps some;
# it has 81 distinct problems, so the splits shrink to fit. A longer, faster cold start gets the format right.
EASY = (
    "task.name=arithmetic",
    "task.arithmetic.digits=1",
    "task.arithmetic.ops=+",
    "data.num_train=64",
    "rejection.num_prompts=48",
    "sft_cold.max_steps=300",
    "sft_cold.lr=0.005",
)


def _report(path) -> dict:
    result = subprocess.run(["alignflow", "report", "--json"], cwd=path, env=ENV, capture_output=True, text=True)
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def r1(tmp_path_factory) -> dict:
    path = make_project(tmp_path_factory.mktemp("r1"), EASY)
    output = repro(path, "r1")
    return {"path": path, "output": output, "grpo": (path / "artifacts/grpo/model.safetensors").read_bytes()}


@pytest.mark.slow
def test_r1_pipeline_runs_every_stage_and_reports_pass_rates_after_each_in_order(r1):
    assert stages_run(r1["output"]) == R1_STAGES
    report = _report(r1["path"])
    models = ["base", "sft", "sft_cold", "grpo", "sft_rs@1", "grpo_final@1"]
    assert [stage for stage in report if stage in models] == models
    for model in models:
        assert {"pass@1", "pass@k"} <= set(report[model]), model
    grpo = report["grpo"]
    for name in (
        "train/zero_variance_groups",
        "train/entropy",
        "train/rewards/accuracy",
        "train/kl",
        "perf/generate_seconds_per_step",
        "perf/total_seconds_per_step",
        "perf/update_mfu",
    ):
        assert name in grpo, name
    perf, params = (
        json.loads((r1["path"] / "metrics/grpo/perf.json").read_text()),
        load_params(r1["path"] / "params.yaml"),
    )
    assert 0 < perf["update_mfu"] < 1.5 and perf["update_tokens_per_second"] > 0
    # Wall-clock numbers stay out of the stage's outputs (dvc.lock hashes those): a row per step in perf_steps.tsv.
    steps = (r1["path"] / "metrics/grpo/perf_steps.tsv").read_text().splitlines()
    assert steps[0].split("\t")[:5] == ["step", "generate", "score", "train", "total"]
    assert [row.split("\t")[0] for row in steps[1:]] == [str(step) for step in range(1, params.grpo.steps + 1)]
    assert {"time", "perf"}.isdisjoint(json.loads((r1["path"] / "metrics/grpo/metrics.json").read_text()))
    # Verified samples over all samples; the distinct ones kept (at most max_per_prompt a prompt) are among them.
    rejection, cfg = report["rejection@1"], params.rejection
    verified = rejection["acceptance_rate"] * cfg.num_prompts * cfg.samples_per_prompt
    assert verified >= rejection["accepted"] > 0
    assert rejection["accepted"] <= cfg.max_per_prompt * cfg.num_prompts
    assert "acceptance_rate_by_difficulty/addition" in report["rejection@1"]


@pytest.mark.slow
def test_every_rejection_sampled_response_passes_the_verifier(r1):
    rows = read_examples(r1["path"] / "artifacts/rejection/1/train.jsonl")
    report = _report(r1["path"])["rejection@1"]
    assert len(rows) == report["accepted"] + report["general"] > 0
    assert all(score_response(row, row.solution) == (True, True) for row in rows)
    sampled_prompts = [row.prompt for row in rows[: report["accepted"]]]
    assert max(sampled_prompts.count(p) for p in sampled_prompts) <= 2  # rejection.max_per_prompt


@pytest.mark.slow
def test_grpo_killed_mid_run_resumes_to_identical_weights(r1):
    """grpo resets its reference every 2 iterations and checkpoints every 2: the reset survives the resume."""
    assert "grpo: resuming from the checkpoint at step 2" in resume_after_kill("grpo", r1["path"])
    assert (r1["path"] / "artifacts/grpo/model.safetensors").read_bytes() == r1["grpo"]
    # and every output as dvc.lock recorded it, its metrics and training curve too
    assert "grpo" not in dvc(r1["path"], "status", "grpo")


@pytest.mark.slow
def test_r1_zero_runs_grpo_straight_from_the_base_model_its_responses_opened_by_the_prefix(tmp_path):
    """R1-Zero's recipe: the prompt ends with '<think>' (task.response_prefix) and a reward for each tag written."""
    path = make_project(tmp_path, (*EASY, "task.response_prefix=<think>", "grpo.rewards.tags=0.5"))
    output = repro(path, "r1_zero")
    assert stages_run(output) == {"data", "base", "grpo_zero", "eval@base", "eval@grpo_zero"}
    report = _report(path)
    assert [stage for stage in report if stage in ("base", "grpo_zero")] == ["base", "grpo_zero"]
    assert {"pass@1", "pass@k"} <= set(report["grpo_zero"])
    for model in ("base", "grpo_zero"):
        rows = [json.loads(line) for line in (path / f"artifacts/eval/{model}/greedy.jsonl").read_text().splitlines()]
        assert rows and all(row["response"].startswith("<think>") for row in rows)
    rewards = json.loads((path / "metrics/grpo_zero/metrics.json").read_text())["train"]["rewards"]
    assert 0.25 <= rewards["tags"] <= 1.0  # the prefix's tag is always there, once


EXAMPLE = Example("arithmetic", "12+30=", "42", "<think>2+0+0=2,1+3+0=4</think><answer>42</answer>")


def test_rejection_keeps_distinct_verified_responses_up_to_the_cap():
    wrong = "<think>2+0+0=2,1+3+0=5</think><answer>52</answer>"
    longer = "<think>2+0+0=2, 1+3+0=4</think><answer>42</answer>"
    responses = [wrong, EXAMPLE.solution, EXAMPLE.solution, "", longer, EXAMPLE.solution.replace("42<", "042<")]
    kept = accepted(EXAMPLE, responses, max_per_prompt=2)
    assert kept == [EXAMPLE.solution, longer]
    assert accepted(EXAMPLE, responses, max_per_prompt=5) == [
        EXAMPLE.solution,
        longer,
        EXAMPLE.solution.replace("42<", "042<"),
    ]


def test_rejection_ranks_by_the_reward_model_when_a_task_has_no_verifier(monkeypatch):
    essays = types.ModuleType("essay_task")  # a task of your own without a verifier
    essays.difficulty = lambda example: "essay"
    monkeypatch.setitem(sys.modules, "essay_task", essays)
    example = Example("essay_task", "Write:", "", "")
    responses = ["short", "a longer answer", "the longest answer of all", "short"]

    def by_length(_, texts: list[str]) -> list[float]:  # a stand-in reward model
        return [float(len(t)) for t in texts]

    kept = accepted(example, responses, max_per_prompt=4, rank=by_length, top_by_rank=2)
    assert kept == ["a longer answer", "the longest answer of all"]
