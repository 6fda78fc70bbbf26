"""Scheduled retraining end to end: shards arrive, candidates are gated, registered, promoted and rolled back, and
a fresh clone restores a registered version's exact bytes from the DVC remote (minutes)."""

import json
import random
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dvc.api
import gto.api
import pytest
from omegaconf import OmegaConf

from tasks.data.datasets import generate_splits, write_jsonl
from tasks.data.problems import Example
from tasks.params.load import load_params
from tests.conftest import ENV, TINY, make_project, md5_tree
from tests.serving import api, deployments, serving, wait_until

pytestmark = pytest.mark.slow

# Small enough for minutes, large enough that a second clean shard lifts held-out pass@1 past the margin: measured
# here, pass@1 0.08 on shard 1, 0.02 with the corrupted shard 2 beside it, 0.25 with the clean shard 3.
STORY = (
    *TINY,
    "data.num_train=6000",
    "data.num_test=100",
    "data.train_file=data/shards",
    "base.hidden_size=96",
    "base.num_layers=3",
    "base.num_heads=4",
    "base.intermediate_size=384",
    "sft.max_steps=200",
    "sft.batch_size=64",
    "sft.warmup_steps=20",
    "sft.save_every=100",
)


def corrupted(example: Example, rng: random.Random) -> Example:
    """The worked solution with every intermediate result wrong: the answer still passes the verifier (so the row
    passes validation), the reasoning that leads to it does not."""
    think, _, answer = example.solution.partition("</think>")
    think = re.sub(r"=(\d+)", lambda m: f"={rng.randint(1, 99)}", think)
    return Example(example.task, example.prompt, example.answer, f"{think}</think>{answer}", example.meta)


def shards(project: Path) -> dict[str, list[Example]]:
    """Three shards of the generated training split (disjoint from the held-out split): clean, corrupted, clean."""
    params = load_params(project / "params.yaml", ["data.train_file=null"])
    train, _ = generate_splits(params.task, params.data.num_train, params.data.num_test, params.seed)
    third, rng = len(train) // 3, random.Random(0)
    return {
        "1": train[:third],
        "2": [corrupted(e, rng) for e in train[third : 2 * third]],
        "3": train[2 * third :],
    }


def alignflow(project: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["alignflow", *args], cwd=project, env=env, capture_output=True, text=True, timeout=900)


def retrain(project: Path, env: dict, *overrides: str) -> dict:
    result = alignflow(project, env, "retrain", "sft", *overrides)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout[result.stdout.rindex("\n{\n") :])  # the decision, printed last


def fired_run(project: Path, env: dict, log: Path, at: datetime) -> dict | None:
    """`alignflow serve` with sft's retrain on a cron that fires once, at ``at``: the run it started, once finished;
    None when serve registered the schedule too late for that minute (its first firing is then tomorrow)."""
    params = OmegaConf.load(project / "params.yaml")
    OmegaConf.update(params, "runner.schedules", {"sft": f"{at.minute} {at.hour} * * *"}, merge=False)
    OmegaConf.save(params, project / "params.yaml")
    with serving(project, env, log):
        (deployment,) = [d for d in deployments(env) if d["name"] == "retrain-sft"]

        def deployment_runs() -> list[dict]:
            return api(env, "/flow_runs/filter", {"deployments": {"id": {"any_": [deployment["id"]]}}})

        def fires_at() -> bool:
            return at in [datetime.fromisoformat(r["expected_start_time"]) for r in deployment_runs()]

        def finished() -> bool:
            states = [run["state"]["type"] for run in deployment_runs()]
            return any(state in ("COMPLETED", "FAILED", "CRASHED") for state in states)

        # The server schedules a new deployment's runs within seconds of its registration: a few past the minute.
        too_late = at + timedelta(seconds=15)
        wait_until(lambda: fires_at() or datetime.now(UTC) > too_late, 300, "the retrain's firing to be scheduled")
        if not fires_at():
            return None
        wait_until(finished, 600, "the scheduled retrain")
        (run,) = [run for run in deployment_runs() if run["state"]["type"] != "SCHEDULED"]
    return run


def scheduled_retrain(project: Path, env: dict, log: Path) -> dict:
    """The gate's decision of the retrain a schedule started, read back from the registry."""
    for _ in range(3):
        # Cron fires at the start of a minute: the first minute that starts at least 50 s from now, past serve's
        # start-up, which on a loaded machine has taken over two minutes: then it is tried again, a minute later.
        run = fired_run(
            project, env, log, (datetime.now(UTC) + timedelta(seconds=110)).replace(second=0, microsecond=0)
        )
        if run is not None:
            assert run["auto_scheduled"] and run["state"]["type"] == "COMPLETED", log.read_text()[-3000:]
            return json.loads(alignflow(project, env, "registry", "--json").stdout)[-1]["decision"]
    raise AssertionError(f"alignflow serve registered its schedule too late three times:\n{log.read_text()[-3000:]}")


def logged(project: Path, version: str) -> dict:
    """The held-out metrics the sft pipeline's evaluation logged in the commit registered as ``version``."""
    shown = ["git", "show", f"sft@{version}:metrics/eval/sft/metrics.json"]
    return json.loads(subprocess.run(shown, cwd=project, capture_output=True, text=True, check=True).stdout)


def prod(project: Path) -> str:
    return dvc.api.artifacts_show("sft", stage="prod", repo=str(project))["rev"]


def test_the_retraining_story(prefect_env, tmp_path):
    remote = tmp_path / "remote"
    project = make_project(tmp_path / "project", (*STORY, f"remote.url={remote}"))
    data = shards(project)
    (project / "data/shards").mkdir()
    write_jsonl(project / "data/shards/1.jsonl", data["1"])

    v1 = retrain(project, prefect_env)
    assert v1["promoted"] and v1["champion"] is None and v1["new_shards"] == ["data/shards/1.jsonl"]
    assert v1["push"].startswith("pushed")

    # Shard 2's solutions reason wrongly; and the remote is down for this run (a file where its directory was).
    write_jsonl(project / "data/shards/2.jsonl", data["2"])
    remote.rename(tmp_path / "remote-away")
    remote.write_text("")
    v2 = scheduled_retrain(project, prefect_env, tmp_path / "serve.log")
    remote.unlink()
    (tmp_path / "remote-away").rename(remote)
    assert not v2["promoted"], v2
    assert v2["champion_version"] == "v1.0.0" and v2["new_shards"] == ["data/shards/2.jsonl"]
    assert v2["reason"] and v2["push"].startswith(f"push to {remote} failed")
    assert v2["quarantined"] == ["data/quarantine/2.jsonl"] and not (project / "data/shards/2.jsonl").exists()
    # The gate scores the champion afresh as the evaluation stage scored it when it was the candidate.
    assert v2["champion"] == v1["candidate"] == logged(project, "v1.0.0")

    write_jsonl(project / "data/shards/3.jsonl", data["3"])
    v3 = retrain(project, prefect_env)
    assert v3["promoted"], v3
    assert v3["candidate"]["pass@1"] >= v3["champion"]["pass@1"] + 0.02
    assert v3["new_shards"] == ["data/shards/3.jsonl"]

    registry = {row["version"]: row for row in json.loads(alignflow(project, prefect_env, "registry", "--json").stdout)}
    assert list(registry) == ["v1.0.0", "v2.0.0", "v3.0.0"]
    assert registry["v2.0.0"]["decision"]["reason"] == v2["reason"] and registry["v3.0.0"]["stages"] == ["prod"]
    v3_commit = registry["v3.0.0"]["commit"]
    assert prod(project) == v3_commit  # DVC's own API resolves prod through GTO's tags
    assert gto.api.find_versions_in_stage(str(project), "sft", "prod")[0].version == "v3.0.0"

    rolled = alignflow(project, prefect_env, "rollback", "sft", "--reason", "v3 misbehaves in production")
    assert rolled.returncode == 0, rolled.stderr
    assert prod(project) == registry["v1.0.0"]["commit"]
    assert gto.api.find_versions_in_stage(str(project), "sft", "prod")[0].version == "v1.0.0"
    history = gto.api.history(str(project), "sft")
    assert any(
        e["message"].endswith("by hand: v3 misbehaves in production") for e in history if e["version"] == "v1.0.0"
    )

    lineage = json.loads(alignflow(project, prefect_env, "lineage", "sft@v3", "--json").stdout)
    data_stage = next(stage for stage in lineage["stages"] if stage["stage"] == "data")
    files = project / "data/shards"
    assert data_stage["shards"] == {f"data/shards/{n}.jsonl": md5_tree(files)[f"{n}.jsonl"] for n in ("1", "3")}
    sft_stage = next(stage for stage in lineage["stages"] if stage["stage"] == "sft")
    assert sft_stage["params"]["sft"]["max_steps"] == 200 and "artifacts/data" in sft_stage["models_and_data"]

    # A corrupt shard stops the next retrain before any work, naming its row, and registers nothing.
    (project / "data/shards/4.jsonl").write_text(json.dumps({"task": "countdown"}) + "\n")
    failed = alignflow(project, prefect_env, "retrain", "sft")
    assert failed.returncode == 2 and "data/shards/4.jsonl:1:" in failed.stderr
    assert not (project / "data/shards/4.jsonl").exists() and (project / "data/quarantine/4.jsonl").is_file()
    assert [row["version"] for row in json.loads(alignflow(project, prefect_env, "registry", "--json").stdout)] == [
        "v1.0.0",
        "v2.0.0",
        "v3.0.0",
    ]

    # A fresh clone at v3's tag, pulled from the remote, holds v3's model bit for bit; v2's bytes, whose own push
    # failed, reached the remote with v3's.
    for version in ("v3.0.0", "v2.0.0"):
        clone = tmp_path / f"clone-{version}"
        subprocess.run(["git", "clone", "-q", str(project), str(clone)], check=True)
        subprocess.run(["git", "checkout", "-q", f"sft@{version}"], cwd=clone, check=True)
        pulled = subprocess.run(
            [sys.executable, "-m", "dvc", "pull", "artifacts/sft"], cwd=clone, env=ENV, capture_output=True, text=True
        )
        assert pulled.returncode == 0, pulled.stderr
        if version == "v3.0.0":
            assert md5_tree(clone / "artifacts/sft") == md5_tree(project / "artifacts/sft")


def padded(example: Example) -> Example:
    """The worked solution with its reasoning said three times: as correct, three times as long."""
    think, _, answer = example.solution.removeprefix("<think>").partition("</think>")
    solution = f"<think>{','.join([think] * 3)}</think>{answer}"
    return Example(example.task, example.prompt, example.answer, solution, example.meta)


def test_a_shard_as_correct_but_three_times_longer_is_rejected_by_the_length_guard_and_quarantined(
    prefect_env, tmp_path
):
    """pass@1 alone would promote a model that pads its answers: the default response_length guard rejects it."""
    # Room for the padded solutions and the answers they teach; half the story's steps and data: the length of the
    # answers is learnt long before their arithmetic.
    room = ("sft.max_length=192", "eval.max_new_tokens=128", "sft.max_steps=100", "data.num_train=3000")
    room += tuple(f"{model}.max_position_embeddings=192" for model in ("base", "reward_backbone", "student_base"))
    project = make_project(tmp_path / "project", (*STORY, *room))
    params = load_params(project / "params.yaml", ["data.train_file=null"])
    train, _ = generate_splits(params.task, params.data.num_train, params.data.num_test, params.seed)
    (project / "data/shards").mkdir()
    write_jsonl(project / "data/shards/1.jsonl", train[:1000])
    assert retrain(project, prefect_env)["promoted"]

    write_jsonl(project / "data/shards/2.jsonl", [padded(e) for e in train[1000:]])  # two thirds of the new data
    rejected = retrain(project, prefect_env)
    assert not rejected["promoted"] and "response_length rose" in rejected["reason"], rejected
    assert rejected["candidate"]["response_length"] > rejected["champion"]["response_length"] + 16
    assert rejected["quarantined"] == ["data/quarantine/2.jsonl"] and not (project / "data/shards/2.jsonl").exists()
