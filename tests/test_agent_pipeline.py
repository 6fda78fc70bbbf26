"""The agent pipeline end to end on a tiny configuration, from `alignflow repro agent` and from its Prefect flow:
agent data (the calculator) -> agent_base -> SFT on the traces -> GRPO on episodes -> eval as an agent, every RL and
eval episode written beside the stage's outputs, and the default pipelines' stages left alone."""

import json
import subprocess
import urllib.request

import pytest
import yaml

from tests.conftest import make_project, report_json, stages_run, warm

pytestmark = pytest.mark.slow

STAGES = {"agent_data", "agent_base", "agent_sft", "agent_grpo", "agent_eval@agent_sft", "agent_eval@agent_grpo"}


@pytest.fixture(scope="module")
def agent(tmp_path_factory) -> dict:
    path = make_project(tmp_path_factory.mktemp("agent"))
    result = subprocess.run(["alignflow", "repro", "agent"], cwd=path, env=warm(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"path": path, "output": result.stdout + result.stderr}


def _episodes(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_repro_agent_runs_its_own_stages_on_its_own_task(agent):
    path = agent["path"]
    assert stages_run(agent["output"]) == STAGES  # none of the default pipelines' (data, base, ...)
    rows = [json.loads(line) for line in (path / "artifacts/agent_data/train.jsonl").read_text().splitlines()]
    assert {row["task"] for row in rows} == {"examples.calculator"} and all(row["meta"]["turns"] for row in rows)
    report = report_json(path)  # an evaluation reports under the stage that trained its model
    for model in ("agent_sft", "agent_grpo"):
        assert {"pass@1", "turns", "tool_calls", "tool_errors", "max_turns_rate"} <= set(report[model]), model


def test_the_rl_stage_and_every_eval_write_their_episodes_turn_by_turn(agent):
    path = agent["path"]
    steps = yaml.safe_load((path / "params.yaml").read_text())["agent_grpo"]["steps"]
    played = _episodes(path / "artifacts/agent_grpo/episodes.jsonl")
    assert {row["step"] for row in played} == set(range(1, steps + 1))
    for row in played:
        assert row["messages"][0] == {"role": "user", "content": row["prompt"]}
        assert row["messages"][-1]["content"] == row["response"] and row["turns"] >= 1
        assert {"correct", "reward", "tool_calls", "tool_errors", "truncated"} <= set(row)
    for model in ("agent_sft", "agent_grpo"):
        greedy = _episodes(path / f"artifacts/agent_eval/{model}/episodes.jsonl")
        assert len(greedy) == yaml.safe_load((path / "params.yaml").read_text())["agent_data"]["num_test"]
    # DVC tracks them: they are inside the stages' outputs, whose hashes dvc.lock records
    lock = yaml.safe_load((path / "dvc.lock").read_text())["stages"]
    assert [out["path"] for out in lock["agent_grpo"]["outs"]][0] == "artifacts/agent_grpo"
    assert lock["agent_grpo"]["params"]["params.yaml"]["agent_grpo"]["steps"] == steps
    data_hash = next(out["md5"] for out in lock["agent_data"]["outs"])
    assert {dep["path"]: dep["md5"] for dep in lock["agent_grpo"]["deps"]}["artifacts/agent_data"] == data_hash


def test_the_prefect_flow_shows_episodes_as_conversations_in_the_stage_summaries(agent, prefect_env):
    path = agent["path"]
    result = subprocess.run(
        ["alignflow", "run", "agent"], cwd=path, env=prefect_env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "agent_grpo is up to date: skipped" in result.stdout + result.stderr  # the same DAG as repro's
    request = urllib.request.Request(
        f"{prefect_env['PREFECT_API_URL']}/artifacts/filter", b"{}", {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        shown = {artifact["key"]: artifact["data"] for artifact in json.loads(response.read())}
    for key in ("agent-grpo", "agent-eval-agent-grpo"):
        assert "Episode: `What is " in shown[key] and "| user | `What is " in shown[key], key


def test_a_tool_reading_its_rows_hidden_data_runs_through_repro_agent_with_no_environment_code(tmp_path):
    path = make_project(tmp_path)
    small = ["agent_data.num_train=64", "agent_data.num_test=4", "agent_sft.max_steps=4", "agent_grpo.steps=1"]
    args = ["alignflow", "repro", "agent", "@examples/shop/tiny.args", *small, "agent_eval.k=1"]
    result = subprocess.run(args, cwd=path, env=warm(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert stages_run(result.stdout + result.stderr) == STAGES
    rows = [json.loads(line) for line in (path / "artifacts/agent_data/train.jsonl").read_text().splitlines()]
    assert {row["task"] for row in rows} == {"examples.shop"} and all(row["meta"]["prices"] for row in rows)
    assert {"pass@1", "tool_calls", "tool_errors"} <= set(report_json(path)["agent_grpo"])
