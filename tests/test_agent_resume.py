"""The agent pipeline's RL stage killed with kill -9 resumes to the weights and the episodes of the run that was
never killed."""

import json

import pytest

from tests.conftest import dvc, make_project, resume_after_kill

# A cold start of 150 steps at a high lr is what gets the tiny model to call the tool now and then; the length
# reward gives every group a spread of scores, so each iteration updates the policy (the tiny model is never right,
# and accuracy alone would teach nothing).
CALCULATOR = (
    "agent_data.num_train=32",
    "agent_data.num_test=4",
    "agent_sft.max_steps=150",
    "agent_sft.lr=0.005",
    "agent_sft.save_every=150",
    "agent.max_turns=3",
    "agent_grpo.steps=4",
    "agent_grpo.save_every=2",
    "agent_grpo.rollout_batch_size=4",
    "agent_grpo.group_size=2",
    "agent_grpo.minibatch_size=8",
    "agent_grpo.dynamic_sampling=false",
    "agent_grpo.rewards={accuracy: 1.0, environment: 0.5, length: 0.1}",
)


def curve(path, name: str) -> dict[int, float]:
    rows = (path / f"metrics/agent_grpo/plots/metrics/train/{name}.tsv").read_text().splitlines()[1:]
    return {int(step): float(value) for step, value in (row.split("\t") for row in rows)}


@pytest.mark.slow
def test_grpo_on_the_calculator_killed_mid_run_resumes_to_identical_weights(tmp_path):
    path = make_project(tmp_path, CALCULATOR)
    dvc(path, "repro", "agent_grpo")
    weights = (path / "artifacts/agent_grpo/model.safetensors").read_bytes()
    episodes = (path / "artifacts/agent_grpo/episodes.jsonl").read_bytes()
    played = json.loads((path / "metrics/agent_grpo/metrics.json").read_text())["train"]
    assert {"turns", "tool_calls", "tool_errors", "max_turns_rate"} <= set(played)
    # The iterations the resumed run plays must reach the tool's sandbox, or the resume would only replay
    # single-turn episodes.
    calls = curve(path, "tool_calls")
    assert any(count > 0 for step, count in calls.items() if step > 2), calls

    assert "agent_grpo: resuming from the checkpoint at step 2" in resume_after_kill("agent_grpo", path)
    assert (path / "artifacts/agent_grpo/model.safetensors").read_bytes() == weights
    # the episodes of the iterations before the kill come back from the checkpoint, the rest are played again
    assert (path / "artifacts/agent_grpo/episodes.jsonl").read_bytes() == episodes
    # and every output as dvc.lock recorded it, its metrics and training curves too
    assert "agent_grpo" not in dvc(path, "status", "agent_grpo")
