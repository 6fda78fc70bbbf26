"""An RL stage on an agent task killed with kill -9 resumes to the weights of the run that was never killed."""

import json

import pytest

from tests.conftest import dvc, make_project, resume_after_kill

# The calculator's traces need the longer positions of docs/agents.md. A cold start of 150 steps at a high lr is
# what gets the tiny model to call the tool now and then; the length reward gives every group a spread of scores,
# so each iteration updates the policy (the tiny model is never right, and accuracy alone would teach nothing).
CALCULATOR = (
    "task.name=examples.calculator",
    "data.num_train=32",
    "data.num_test=4",
    "base.max_position_embeddings=256",
    "sft_cold.max_length=200",
    "sft_cold.max_steps=150",
    "sft_cold.lr=0.005",
    "sft_cold.num_examples=32",
    "sft_cold.save_every=150",
    "agent.max_turns=3",
    "grpo.steps=4",
    "grpo.save_every=2",
    "grpo.rollout_batch_size=4",
    "grpo.group_size=2",
    "grpo.minibatch_size=8",
    "grpo.max_new_tokens=100",
    "grpo.dynamic_sampling=false",
    "grpo.rewards={accuracy: 1.0, environment: 0.5, length: 0.1}",
)


def curve(path, name: str) -> dict[int, float]:
    rows = (path / f"metrics/grpo/plots/metrics/train/{name}.tsv").read_text().splitlines()[1:]
    return {int(step): float(value) for step, value in (row.split("\t") for row in rows)}


@pytest.mark.slow
def test_grpo_on_the_calculator_killed_mid_run_resumes_to_identical_weights(tmp_path):
    path = make_project(tmp_path, CALCULATOR)
    dvc(path, "repro", "grpo")
    weights = (path / "artifacts/grpo/model.safetensors").read_bytes()
    played = json.loads((path / "metrics/grpo/metrics.json").read_text())["train"]
    assert {"turns", "tool_calls", "tool_errors", "max_turns_rate"} <= set(played)
    # The iterations the resumed run plays must reach the tool's sandbox, or the resume would only replay
    # single-turn episodes.
    assert any(calls > 0 for step, calls in curve(path, "tool_calls").items() if step > 2), curve(path, "tool_calls")

    assert "grpo: resuming from the checkpoint at step 2" in resume_after_kill("grpo", path)
    assert (path / "artifacts/grpo/model.safetensors").read_bytes() == weights
    # and every output as dvc.lock recorded it, its metrics and training curves too
    assert "grpo" not in dvc(path, "status", "grpo")
