"""Faults that used to lose work or poison a model while exiting 0 (issue 19), each reproduced as the report did:
divergence, a bad params.yaml under `alignflow repro`, unchecked RL prompts, late reward-import and value errors,
missing upstream models, and the shutdown tracebacks. Bad-input cases by the dozen live in test_validation.py."""

import json
import random
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

import tasks.rl.policy_gradient
import tasks.rl.trainer
import tasks.stages.sft
from flows.cli import main
from tasks.data.datasets import PreferencePair, read_examples, write_jsonl
from tests.conftest import ENV, REPO, TINY, make_project, md5_tree, repro, run_seed

SFT_STEPS, SFT_SAVE_EVERY = 40, 10
GRPO_STEPS, GRPO_SAVE_EVERY = 6, 2


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A project directory (params shrunk to TINY) where `data` and `base` have run: every stage's inputs."""
    path = tmp_path_factory.mktemp("trained")
    params = OmegaConf.merge(OmegaConf.load(REPO / "params.yaml"), OmegaConf.from_dotlist(TINY))
    OmegaConf.save(params, path / "params.yaml")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(path)
        assert main(["stage", "data"]) == 0 and main(["stage", "base"]) == 0
    return path


@pytest.fixture
def project(trained, tmp_path, monkeypatch) -> Path:
    """A private copy of ``trained``, as the working directory."""
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _checkpoint(stage: str) -> dict:
    (path,) = Path(".alignflow/checkpoints", stage).glob("*/latest.pt")
    return torch.load(path, map_location="cpu", weights_only=False)


def _all_finite(tensors: dict[str, torch.Tensor]) -> bool:
    return all(torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point())


def test_sft_that_diverges_stops_at_the_step_and_writes_nothing(project, capsys):
    """Defect 1: `sft.lr=1e6` made every weight NaN and exited 0."""
    overrides = ["sft.lr=1e6", "sft.max_steps=20", "sft.save_every=5", "sft.warmup_steps=0"]
    assert main(["stage", "sft", *overrides]) == 1
    error = capsys.readouterr().err
    assert re.search(r"sft step \d+: the (loss|gradient norm) is (nan|inf)", error), error
    assert not Path("artifacts/sft").exists() and not Path("metrics/sft").exists()


def test_sft_lr_inf_is_refused_by_validation(project, capsys):
    """Defect 1: `sft.lr=inf` passed validation."""
    assert main(["stage", "sft", "sft.lr=inf"]) == 2
    assert "sft.lr: must be a finite number, got inf" in capsys.readouterr().err


HUGE_REWARD = "def huge(batch):\n    return [1e308] * len(batch.responses)\n"


def test_a_reward_of_1e308_stops_grpo_before_the_advantage(project, capsys):
    """Defect 1: a user reward returning 1e308 made all of GRPO's weights NaN and exited 0."""
    Path("huge_reward.py").write_text(HUGE_REWARD)
    assert main(["stage", "grpo_zero", "grpo.rewards={huge_reward:huge: 1.0}"]) == 1
    error = capsys.readouterr().err
    # 1e308 overflows the float32 rewards tensor: the guard sees inf
    assert "grpo_zero step 1: reward 'huge_reward:huge' is inf for response 0, outside +-1e+06" in error, error
    assert not Path("artifacts/grpo_zero").exists()


@pytest.mark.parametrize("seed", [run_seed()])
def test_nan_at_a_random_sft_step_keeps_the_last_checkpoint_and_a_rerun_with_a_lower_lr_resumes(
    project, capsys, monkeypatch, seed
):
    step = random.Random(seed).randint(SFT_SAVE_EVERY + 1, SFT_STEPS)
    calls = {"count": 0}

    def poisoned_loss(*args):
        calls["count"] += 1
        loss = sft_loss(*args)
        return loss * float("nan") if calls["count"] == step else loss

    sft_loss = tasks.stages.sft.sft_loss
    monkeypatch.setattr(tasks.stages.sft, "sft_loss", poisoned_loss)
    schedule = [f"sft.max_steps={SFT_STEPS}", f"sft.save_every={SFT_SAVE_EVERY}"]
    assert main(["stage", "sft", *schedule]) == 1
    kept = (step - 1) // SFT_SAVE_EVERY * SFT_SAVE_EVERY
    error = capsys.readouterr().err
    assert f"sft step {step}: the loss is nan; the checkpoint at step {kept} is kept" in error
    assert not Path("artifacts/sft").exists()
    checkpoint = _checkpoint("sft")
    assert checkpoint["step"] == kept and _all_finite(checkpoint["model"])

    monkeypatch.setattr(tasks.stages.sft, "sft_loss", sft_loss)
    assert main(["stage", "sft", *schedule, "sft.lr=0.0005"]) == 0
    assert f"sft: resuming from the checkpoint at step {kept}" in capsys.readouterr().out
    assert _all_finite(load_file("artifacts/sft/model.safetensors"))
    assert json.loads(Path("metrics/sft/metrics.json").read_text())["step"] == SFT_STEPS


@pytest.mark.slow
@pytest.mark.parametrize("seed", [run_seed()])
@pytest.mark.parametrize("poison", ["reward", "loss"])
def test_nan_at_a_random_grpo_step_keeps_the_last_checkpoint_and_a_rerun_with_a_lower_lr_resumes(
    project, capsys, monkeypatch, poison, seed
):
    step = random.Random(seed).randint(GRPO_SAVE_EVERY + 1, GRPO_STEPS)
    iterations = {"count": 0}
    collect, score = tasks.rl.trainer.collect, tasks.rl.trainer.RewardScorer.score

    def counting_collect(*args, **kwargs):
        iterations["count"] += 1
        return collect(*args, **kwargs)

    def poisoned_score(self, batch):
        total, parts, failures = score(self, batch)
        if iterations["count"] == step:
            total[-1] = float("nan")
        return total, parts, failures

    def poisoned_loss(*args, **kwargs):
        loss = agg_loss(*args, **kwargs)
        return loss * float("nan") if iterations["count"] == step else loss

    monkeypatch.setattr(tasks.rl.trainer, "collect", counting_collect)
    if poison == "reward":
        monkeypatch.setattr(tasks.rl.trainer.RewardScorer, "score", poisoned_score)
    else:
        agg_loss = tasks.rl.policy_gradient.agg_loss
        monkeypatch.setattr(tasks.rl.policy_gradient, "agg_loss", poisoned_loss)
    # The length reward differs within every group (the untrained model never answers right), so each step updates.
    schedule = [f"grpo.steps={GRPO_STEPS}", f"grpo.save_every={GRPO_SAVE_EVERY}", "grpo.rewards={length: 1.0}"]
    assert main(["stage", "grpo_zero", *schedule]) == 1
    kept = (step - 1) // GRPO_SAVE_EVERY * GRPO_SAVE_EVERY
    error = capsys.readouterr().err
    quantity = "reward 'the weighted sum' is nan" if poison == "reward" else "the actor's update: the loss is nan"
    assert f"grpo_zero step {step}: {quantity}" in error and f"the checkpoint at step {kept} is kept" in error, error
    assert not Path("artifacts/grpo_zero").exists()
    checkpoint = _checkpoint("grpo_zero")
    assert checkpoint["step"] == kept and _all_finite(checkpoint["actor"]["model"])

    monkeypatch.undo()
    monkeypatch.chdir(project)
    assert main(["stage", "grpo_zero", *schedule, "grpo.actor_lr=0.00005"]) == 0
    assert f"grpo_zero: resuming from the checkpoint at step {kept}" in capsys.readouterr().out
    assert _all_finite(load_file("artifacts/grpo_zero/model.safetensors"))


def test_rl_prompts_over_the_prompt_bound_are_refused_naming_file_line_and_key(project, capsys):
    """Defect 3: prompts past `max_prompt_length` trained silently in grpo while sft refused them."""
    assert main(["stage", "grpo_zero", "sft.max_prompt_length=4"]) == 2
    error = capsys.readouterr().err
    assert "artifacts/data/train.jsonl:1: the prompt is" in error and "over sft.max_prompt_length=4" in error
    assert not Path("artifacts/grpo_zero").exists() and not Path(".alignflow").exists()


def test_a_cold_start_prompt_over_its_own_bound_names_the_key_the_stage_reads(project, capsys):
    """sft_cold reads sft_cold.max_prompt_length; its error named sft.max_prompt_length, which does not move it."""
    assert main(["stage", "data"]) == 0 and main(["stage", "base"]) == 0
    capsys.readouterr()
    assert main(["stage", "sft_cold", "sft_cold.max_prompt_length=4"]) == 2
    error = capsys.readouterr().err
    assert "artifacts/data/train.jsonl:1: prompt is" in error and "over sft_cold.max_prompt_length=4" in error, error
    assert not Path("artifacts/sft_cold").exists()


def test_a_reward_module_that_raises_on_import_is_named_when_params_load(project, capsys):
    """Defect 4: a reward module raising on import showed a raw traceback, and only when the RL stage started."""
    Path("broken_reward.py").write_text("raise RuntimeError('no GPU found')\ndef f(batch):\n    return []\n")
    assert main(["stage", "grpo", "grpo.rewards={broken_reward:f: 1.0}"]) == 2
    error = capsys.readouterr().err
    assert error.count("grpo.rewards.broken_reward:f: cannot be imported: RuntimeError: no GPU found") == 1
    assert "Traceback" not in error


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("grpo.reward_timeout_seconds=inf", "grpo.reward_timeout_seconds: must be a finite number"),
        ("seed=4294967296", "seed: must be <= 4294967295"),
        ("data.num_train=100000000", "data.num_train: must be <= 1000000"),
    ],
)
def test_values_that_failed_late_are_refused_naming_the_key(project, capsys, override, message):
    """Defect 5: these failed at the first scoring, without naming `seed`, or ran on for hours."""
    before = sorted(Path().rglob("*"))
    assert main(["stage", "data", override]) == 2
    assert message in capsys.readouterr().err
    assert sorted(Path().rglob("*")) == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["stage", "sft", "sft.init=grpo"], "artifacts/grpo: no model there yet; run `alignflow stage grpo` first"),
        (["stage", "eval@nosuch"], "no stage trains a model named 'nosuch'"),
    ],
)
def test_a_missing_upstream_model_names_the_stage_that_makes_it(project, capsys, argv, message):
    """Defect 6: a traceback about connecting to the model hub."""
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert message in error and "huggingface" not in error.lower()


def test_a_reward_failing_on_most_responses_warns_in_the_stage_log(project, capsys):
    """Defect 9: a reward failing on every response showed only in the errors/ metric."""
    Path("failing_reward.py").write_text("def f(batch):\n    raise ValueError('schema changed')\n")
    assert main(["stage", "grpo_zero", "grpo.steps=1", "grpo.rewards={accuracy: 1.0, failing_reward:f: 0.1}"]) == 0
    out = capsys.readouterr().out
    assert "WARNING reward 'failing_reward:f' failed on 32 of 32 responses (ValueError: schema changed)" in out


@pytest.mark.parametrize("dynamic_sampling", [False, True])
def test_iterations_with_nothing_to_learn_from_warn_in_the_stage_log(project, capsys, dynamic_sampling):
    """R1-Zero from a base that is never right, or a reward that scores every sample alike, showed only in the
    accuracy and zero_variance_groups metrics (and, under dynamic sampling that kept no group, in nothing)."""
    Path("constant_reward.py").write_text("def zero(batch):\n    return [0.0] * len(batch.responses)\n")
    rewards = "grpo.rewards={constant_reward:zero: 1}"
    sampling = [f"grpo.dynamic_sampling={str(dynamic_sampling).lower()}", "grpo.max_sampling_rounds=1"]
    assert main(["stage", "grpo_zero", "grpo.steps=5", rewards, *sampling]) == 0
    out = capsys.readouterr().out
    assert "WARNING grpo_zero step 5: every group's samples scored alike in the last 5 iterations" in out
    # a round that kept no group has no rollout to take the accuracy of
    never_right = "WARNING grpo_zero step 5: no sampled response was right in the last 5 iterations (accuracy 0)"
    assert (never_right in out) is not dynamic_sampling
    assert "step 4:" not in out  # not before five iterations have shown it


def test_an_empty_params_file_is_refused(project, capsys):
    """Defect 11: an empty params.yaml ran the built-in defaults under `alignflow stage` without a word."""
    Path("params.yaml").write_text("")
    assert main(["stage", "sft"]) == 2
    assert "params.yaml: empty" in capsys.readouterr().err
    assert not Path("artifacts/sft").exists()


@pytest.mark.slow
def test_repro_with_an_invalid_params_file_keeps_the_previous_outputs_byte_identical(tmp_path):
    """Defect 2: `alignflow repro sft` with `sft.lr: -1` exited 255 after DVC had deleted artifacts/sft."""
    project = make_project(tmp_path)
    repro(project)
    kept = ("artifacts/sft", "metrics/sft", "dvc.lock")

    def snapshot() -> dict[str, bytes]:
        files = [p for name in kept for p in ([project / name] + list((project / name).rglob("*"))) if p.is_file()]
        return {str(p.relative_to(project)): p.read_bytes() for p in files}

    before = snapshot()
    params = OmegaConf.load(project / "params.yaml")
    params.sft.lr = -1
    OmegaConf.save(params, project / "params.yaml")
    result = subprocess.run(["alignflow", "repro", "sft"], cwd=project, env=ENV, capture_output=True, text=True)
    assert result.returncode == 2 and "sft.lr: must be > 0" in result.stderr, result.stderr
    assert "artifacts/sft/model.safetensors" in before and snapshot() == before


CRASH = """
import sys
import tasks.stages.sft

def crash(*args):
    raise RuntimeError("crashed in the loss")

tasks.stages.sft.sft_loss = crash
from flows.cli import main
sys.exit(main(["stage", "sft"]))
"""


@pytest.mark.slow
def test_an_uncaught_failure_ends_without_shutdown_tracebacks(tmp_path):
    """Defect 12: ~10 `Exception ignored in FilePackIndex.__del__` tracebacks after every uncaught failure.
    They come from a clone's git packs, which dvclive opens: the project here is a clone, as a user's is."""
    origin = make_project(tmp_path / "origin")
    project = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(origin), str(project)], check=True)
    env = {**ENV, "PYTHONPATH": str(project)}
    for stage in ("data", "base"):
        subprocess.run(["alignflow", "stage", stage], cwd=project, env=env, check=True, capture_output=True)
    result = subprocess.run([sys.executable, "-c", CRASH], cwd=project, env=env, capture_output=True, text=True)
    assert result.returncode == 1 and "RuntimeError: crashed in the loss" in result.stderr
    assert "Exception ignored" not in result.stderr, result.stderr


def test_a_changed_learning_rate_resumes_only_a_run_that_diverged(project, capsys, monkeypatch):
    """Reproducibility: after a crash (not a divergence) a run with another lr starts afresh, so its weights are
    those of its own params; only a checkpoint kept by a divergence is resumed under a lowered lr."""
    calls = {"count": 0}

    def crash_at_step_15(*args):
        calls["count"] += 1
        if calls["count"] == 15:
            raise KeyboardInterrupt
        return sft_loss(*args)

    sft_loss = tasks.stages.sft.sft_loss
    monkeypatch.setattr(tasks.stages.sft, "sft_loss", crash_at_step_15)
    schedule = ["sft.max_steps=20", "sft.save_every=10"]
    with pytest.raises(KeyboardInterrupt):
        main(["stage", "sft", *schedule])
    monkeypatch.setattr(tasks.stages.sft, "sft_loss", sft_loss)
    capsys.readouterr()
    assert main(["stage", "sft", *schedule, "sft.lr=0.001"]) == 0
    assert "resuming" not in capsys.readouterr().out


# 16 pairs in batches of 8 for 2 epochs: 4 steps a member, a checkpoint at step 2 and, once it is finished, at 4.
REWARD_MODEL = (
    "reward_model.backbone=base",
    "reward_model.ensemble_size=2",
    "reward_model.epochs=2",
    "reward_model.save_every=2",
)

KILL_AT_SAVE = """
import os
import signal
import sys

from flows.cli import main
from tasks.common.training import Checkpointer

saves, save = [], Checkpointer.save

def save_then_die(self, state):
    save(self, state)
    saves.append(state["step"])
    if len(saves) == {saves}:
        os.kill(os.getpid(), signal.SIGKILL)

Checkpointer.save = save_then_die
sys.exit(main(["stage", "reward_model", *{overrides!r}]))
"""


def _reward_model_outputs() -> dict[str, dict[str, str]]:
    return {name: md5_tree(Path(name)) for name in ("artifacts/reward_model", "metrics/reward_model")}


@pytest.mark.slow
@pytest.mark.parametrize(("saves", "member"), [(1, 0), (3, 1)])
def test_a_reward_model_ensemble_killed_mid_member_resumes_to_identical_weights(project, capsys, saves, member):
    """SIGKILLed right after its ``saves``-th checkpoint (``member`` at step 2 of 4; by the third, member 0 is
    finished), the rerun skips the finished member, resumes the one it was in, and ends at the bytes of an
    uninterrupted run."""
    Path("artifacts/preferences").mkdir()
    for split, count in (("train", 16), ("test", 8)):
        examples = read_examples(Path(f"artifacts/data/{split}.jsonl"))[:count]
        pairs = [PreferencePair(e.prompt, e.solution, e.solution[::-1]) for e in examples]
        write_jsonl(Path(f"artifacts/preferences/{split}.jsonl"), pairs)
    assert main(["stage", "reward_model", *REWARD_MODEL]) == 0
    uninterrupted = _reward_model_outputs()
    for name in uninterrupted:
        shutil.rmtree(name)

    script = KILL_AT_SAVE.format(saves=saves, overrides=list(REWARD_MODEL))
    killed = subprocess.run([sys.executable, "-c", script], cwd=project, env=ENV, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not Path("artifacts/reward_model").exists(), "a killed stage must leave no output"

    capsys.readouterr()
    assert main(["stage", "reward_model", *REWARD_MODEL]) == 0
    out = capsys.readouterr().out
    assert f"reward_model member-{member}: resuming from the checkpoint at step 2" in out, out
    assert ("reward_model member-0: resuming from the checkpoint at step 4" in out) == (member == 1), out
    assert _reward_model_outputs() == uninterrupted
    assert not Path(".alignflow/checkpoints/reward_model").exists(), "checkpoints are cleared once the stage succeeds"
