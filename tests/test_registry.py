"""The promotion gate's rule, and the registry's versions, stages, rollbacks and history on real git tags (seconds)."""

import subprocess
import sys
import time
from pathlib import Path

import dvc.api
import gto.api
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.cli import main
from flows.gate import decide
from flows.lineage import own_files
from flows.registry import Decision, assign_prod, prod_version, register, registry, render, rollback
from tasks.common.config import GUARD_DIRECTIONS, ConfigError, RetrainConfig

METRIC = st.floats(0, 1, allow_nan=False)


@given(
    candidate=st.fixed_dictionaries({m: METRIC for m in GUARD_DIRECTIONS}),
    champion=st.fixed_dictionaries({m: METRIC for m in GUARD_DIRECTIONS}),
    margin=st.floats(0, 0.5),
    tolerance=st.floats(0, 0.5),
)
def test_the_gate_promotes_exactly_a_gain_past_the_margin_with_no_guard_past_its_tolerance(
    candidate, champion, margin, tolerance
):
    guards = {"format_rate": tolerance, "gold_reward": tolerance, "truncated_rate": tolerance}
    cfg = RetrainConfig(metric="pass@1", margin=margin, guards=guards)
    promoted, why = decide(candidate, champion, cfg)
    gain = candidate["pass@1"] - champion["pass@1"]
    higher_hold = all(champion[m] - candidate[m] <= tolerance for m in ("format_rate", "gold_reward"))
    guards_hold = higher_hold and candidate["truncated_rate"] - champion["truncated_rate"] <= tolerance
    assert promoted == (gain >= margin and guards_hold)
    assert ("guard regressed" in why) == (not guards_hold)


def test_the_default_guards_reject_answers_as_correct_but_three_times_longer():
    """A shard whose answers were padded keeps pass@1 and the format: the length guard, not pass@1, refuses it."""
    cfg = RetrainConfig()
    champion = {"pass@1": 0.50, "format_rate": 0.99, "response_length": 20.0}
    padded = {"pass@1": 0.60, "format_rate": 0.99, "response_length": 68.0}
    promoted, why = decide(padded, champion, cfg)
    assert not promoted and why == "guard regressed: response_length rose 48.0000 (tolerance 16.0)"
    assert decide({**padded, "response_length": 30.0}, champion, cfg)[0]


def test_a_guard_on_a_metric_the_evaluation_lacks_is_an_error_naming_it():
    cfg = RetrainConfig(guards={"tool_errors": 0.1})
    with pytest.raises(ValueError, match="retrain.guards.tool_errors: the evaluation reports no tool_errors"):
        decide({"pass@1": 0.6}, {"pass@1": 0.5}, cfg)


@pytest.mark.parametrize("better", ["lower", "higher"])
def test_a_guard_on_any_metric_the_eval_reports_follows_the_direction_params_give(better):
    """An agent evaluation's turns (a metric the gate does not know) guarded with its direction from params."""
    cfg = RetrainConfig(guards={"turns": 0.5}, directions={"turns": better})
    champion = {"pass@1": 0.50, "turns": 2.0}
    more_turns, fewer_turns = {"pass@1": 0.60, "turns": 3.0}, {"pass@1": 0.60, "turns": 1.0}
    regressed, held = (more_turns, fewer_turns) if better == "lower" else (fewer_turns, more_turns)
    moved = "rose" if better == "lower" else "fell"
    assert decide(regressed, champion, cfg) == (False, f"guard regressed: turns {moved} 1.0000 (tolerance 0.5)")
    assert decide(held, champion, cfg)[0]
    # env_reward, which agent_eval reports, is known: higher is better
    assert not decide(
        {"pass@1": 0.6, "env_reward": 0.1},
        {"pass@1": 0.5, "env_reward": 0.5},
        RetrainConfig(guards={"env_reward": 0.2}),
    )[0]


def test_a_guard_of_unknown_direction_is_refused_naming_where_to_say_it(tmp_path):
    from tasks.params.load import load_params
    from tests.conftest import REPO

    with pytest.raises(
        ConfigError,
        match=r"retrain.guards.turns: the gate does not know which way turns is better; "
        r"say it in retrain.directions.turns",
    ):
        load_params(REPO / "params.yaml", ["retrain.guards.turns=0.5"])
    with pytest.raises(ConfigError, match="retrain.directions.turns: higher or lower"):
        load_params(REPO / "params.yaml", ["retrain.guards.turns=0.5", "retrain.directions.turns=down"])
    params = load_params(REPO / "params.yaml", ["retrain.guards.turns=0.5", "retrain.directions.turns=lower"])
    assert params.retrain.guards["turns"] == 0.5 and params.retrain.directions == {"turns": "lower"}


def test_the_gate_says_why():
    cfg = RetrainConfig(metric="pass@1", margin=0.02, guards={"format_rate": 0.05})
    champion = {"pass@1": 0.50, "format_rate": 0.99}
    assert decide({"pass@1": 0.60, "format_rate": 0.98}, None, cfg) == (
        True,
        "no champion yet: the first candidate is promoted",
    )
    assert decide({"pass@1": 0.51, "format_rate": 0.99}, champion, cfg) == (
        False,
        "pass@1 0.5100 vs champion 0.5000: gain +0.0100 < margin 0.02",
    )
    promoted, why = decide({"pass@1": 0.90, "format_rate": 0.90}, champion, cfg)
    assert not promoted and why == "guard regressed: format_rate fell 0.0900 (tolerance 0.05)"


def _git(repo: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repo whose dvc.yaml declares the artifact ``sft``, with three commits to register."""
    _git(tmp_path, "init", "-q")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "dvc.yaml").write_text("artifacts:\n  sft:\n    path: artifacts/sft\n    type: model\n")
    for n in (1, 2, 3):
        (tmp_path / "candidate").write_text(str(n))
        _git(tmp_path, "add", "-A")
        _git(tmp_path, "commit", "-qm", f"candidate {n}")
    return tmp_path


def _commit(repo: Path, n: int) -> str:
    return _git(repo, "rev-parse", f"HEAD~{3 - n}")


def _in_prod(repo: Path) -> tuple[str, str]:
    """prod as GTO's lookup and DVC's both see it: they must agree."""
    version, commit = prod_version(repo, "sft")
    assert dvc.api.artifacts_show("sft", stage="prod", repo=str(repo))["rev"] == commit
    return version, commit


def test_versions_promotions_and_rollbacks_leave_one_version_in_prod(repo):
    assert prod_version(repo, "sft") is None and registry(repo) == []
    for n in (1, 2, 3):
        decision = Decision(promoted=n != 2, reason=f"reason {n}", candidate={"pass@1": n / 10})
        assert register(repo, "sft", _commit(repo, n), decision) == f"v{n}.0.0"
        if decision.promoted:
            assign_prod(repo, "sft", f"v{n}.0.0", f"gate: reason {n}")
    assert _in_prod(repo) == ("v3.0.0", _commit(repo, 3))

    assert rollback(repo, "sft", "ops by hand") == "v1.0.0"
    assert _in_prod(repo) == ("v1.0.0", _commit(repo, 1))  # the lower version, though GTO prefers the highest
    assign_prod(repo, "sft", "v2.0.0", "promoted by ops by hand: the gate was too strict")
    assert _in_prod(repo)[0] == "v2.0.0"
    assert rollback(repo, "sft", "ops by hand") == "v1.0.0"

    rows = registry(repo)
    assert [(row["version"], row["stages"]) for row in rows] == [("v1.0.0", ["prod"]), ("v2.0.0", []), ("v3.0.0", [])]
    assert rows[1]["decision"] == Decision(False, "reason 2", {"pass@1": 0.2}).__dict__
    events = [(a["event"], a["why"]) for a in rows[1]["assignments"]]
    assert events == [
        ("assignment", "promoted by ops by hand: the gate was too strict"),
        ("unassignment", "replaced by v1.0.0"),
    ]
    assert "rollback from v2.0.0 by ops by hand" in [e["message"] for e in gto.api.history(str(repo), "sft")]
    assert "gate: rejected: reason 2" in render(rows)


def test_prod_is_the_promoted_version_when_a_registry_write_straddles_a_second(repo, monkeypatch):
    """On a busy machine the unassignment of the version leaving prod can land a second after the promotion's own
    tag; DVC's lookup (the stage's latest tag, whatever its action) must still name the promoted version."""
    for n in (1, 2):
        register(repo, "sft", _commit(repo, n), Decision(True, f"reason {n}", {}))
    assign_prod(repo, "sft", "v1.0.0", "gate: reason 1")
    unassign = gto.api.unassign

    def slow_unassign(*args, **kwargs):
        time.sleep(1.1)
        return unassign(*args, **kwargs)

    monkeypatch.setattr(gto.api, "unassign", slow_unassign)
    assign_prod(repo, "sft", "v2.0.0", "gate: reason 2")
    assert _in_prod(repo) == ("v2.0.0", _commit(repo, 2))


def test_rollback_needs_an_earlier_prod_version(repo):
    register(repo, "sft", _commit(repo, 1), Decision(True, "first", {}))
    assign_prod(repo, "sft", "v1.0.0", "gate: first")
    with pytest.raises(ConfigError, match="no earlier prod version"):
        rollback(repo, "sft", "ops")


def _tags(repo: Path) -> list[str]:
    return _git(repo, "tag").split()


def _commit_a_model(repo: Path) -> str:
    """A commit whose dvc.lock records the model's directory, as a retrain's candidate commit does."""
    (repo / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  sft:\n    cmd: alignflow stage sft\n    outs:\n    - path: artifacts/sft\n"
        "      md5: 0123456789abcdef0123456789abcdef.dir\n"
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "a model")
    return _git(repo, "rev-parse", "HEAD")


def test_promoting_the_version_in_prod_is_a_no_op_that_says_so(repo, monkeypatch, capsys):
    register(repo, "sft", _commit_a_model(repo), Decision(True, "first", {}))
    monkeypatch.chdir(repo)
    assert main(["promote", "sft@v1"]) == 0
    tags = _tags(repo)
    assert main(["promote", "sft@v1"]) == 0
    assert "sft@v1.0.0 is already in prod: nothing to do" in capsys.readouterr().out
    assert _tags(repo) == tags


def test_a_version_whose_commit_holds_no_model_is_refused_naming_the_tag(repo, monkeypatch, capsys):
    register(repo, "sft", _commit(repo, 1), Decision(True, "by hand", {}))  # no dvc.lock in that commit
    tags = _tags(repo)
    monkeypatch.chdir(repo)
    for command in (["promote", "sft@v1"], ["lineage", "sft@v1"]):
        assert main(command) == 2
        assert f"sft@v1.0.0: its commit {_commit(repo, 1)[:8]} has no dvc.lock" in capsys.readouterr().err
    assert _tags(repo) == tags


@pytest.mark.parametrize("message", ['{"promoted": true}', "[1, 2]", "42", "shipped by hand"])
def test_a_registration_message_that_is_no_gate_decision_is_shown_as_written(repo, monkeypatch, capsys, message):
    gto.api.register(str(repo), "sft", _commit(repo, 1), version="v1.0.0", message=message)
    monkeypatch.chdir(repo)
    assert main(["registry"]) == 0
    assert f"gate: none recorded (registered by hand: {message!r})" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["registry"], ["promote", "sft@v1"], ["report"], ["lineage", "sft"]])
def test_a_registry_command_outside_a_project_says_so_in_one_line(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err == (
        f"alignflow: error: {tmp_path}: not in a DVC project (no .dvc here or above); `alignflow {command[0]}` runs "
        "in an alignflow project: a clone of it, or any git repository with `dvc init` run\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("section", ["data", "agent_data", "preferences"])
def test_lineage_reads_the_files_of_whichever_stage_reads_data_of_your_own(section):
    """A lineage through preferences (whose pairs may be files under data/) or agent_data names that stage's own
    files, not a `data` section it does not record."""
    files = {"num_prompts": 4, "train_file": "data/mine.jsonl", "test_file": None}
    stage = {"params": {"params.yaml": {"seed": 0, "eval.batch_size": 8, section: files}}}
    assert own_files(stage) == files
    assert own_files({"params": {"params.yaml": {"seed": 0}}}) == {}
