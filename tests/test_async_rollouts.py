"""Asynchronous rollouts (``max_staleness``, tasks/rl/async_rollouts.py): which policy sampled each iteration's
rollout, the same prompts as a synchronous run, and a run killed mid-way resuming to the same bits."""

import contextlib
import io
import subprocess
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace

import pytest
import ray
from safetensors.torch import load_file

from tasks.common.config import Params
from tasks.common.registry import run_stage
from tasks.data.problems import Example
from tasks.params.load import load_params
from tasks.rl.async_rollouts import RolloutsAhead
from tasks.rl.learner import LoopState
from tasks.rl.role_handles import Pending, Roles
from tasks.rl.trainer import collect
from tasks.rollout.engine import Completion
from tests.conftest import kill_at_first_checkpoint, make_project, warm

SEED = 0
EXAMPLES = [Example("arithmetic", f"q{i}=", str(i), f"<answer>{i}</answer>") for i in range(40)]


class VersionedEngines:
    """Engines apart from the actor that sample the version of the weights they hold at the time of the call (as a
    Ray actor runs its calls in order): every completion's text is ``prompt@version``."""

    apart = True

    def __init__(self):
        self.version = 0

    def sample(self, examples: list[Example]) -> Pending:
        completions = [Completion(i, [1], [2], f"{e.prompt}@{self.version}", [-0.5]) for i, e in enumerate(examples)]
        return Pending(completions, remote=False)

    def load_weights(self, version: int) -> None:
        self.version = version


class ZeroScorer:
    def score(self, inputs):
        import torch

        return torch.zeros(len(inputs)), {}, {}


def _run(staleness: int, steps: int, samples_at=lambda step: True) -> list[tuple[list[str], int]]:
    """The trainer's order of calls: collect iteration t, then hand the engines the weights of t + 1. Each
    iteration's (prompts, the weights' version that sampled them)."""
    cfg = replace(
        Params().grpo, rollout_batch_size=4, group_size=1, steps=steps, max_staleness=staleness, dynamic_sampling=False
    )
    engines, state, seen = VersionedEngines(), LoopState(), []
    roles = Roles(actor=None, rollout=engines)  # collect only samples and scores: the actor is never called
    ahead = RolloutsAhead(roles, EXAMPLES, cfg, SEED, samples_at) if staleness else None
    clock = dict.fromkeys(("time/generate", "time/score", "time/train"), 0.0)
    for step in range(steps):
        if samples_at(step):
            rollout, stats = collect(roles, ZeroScorer(), EXAMPLES, cfg, state, SEED, clock, ahead)
            (version,) = {int(c.text.split("@")[1]) for c in rollout.completions}
            assert stats.get("staleness", 0) == step - version  # logged: how far the sampling weights lag
            seen.append(([e.prompt for e in rollout.examples], version))
        state.step = step + 1
        engines.load_weights(step + 1)
    return seen


@pytest.mark.parametrize("staleness", [1, 2, 3])
def test_iteration_t_trains_on_what_the_policy_of_t_minus_max_staleness_sampled_from_the_same_prompts(staleness):
    synchronous, asynchronous = _run(0, 8), _run(staleness, 8)
    assert [version for _, version in synchronous] == list(range(8))
    assert [version for _, version in asynchronous] == [max(0, t - staleness) for t in range(8)]
    assert [prompts for prompts, _ in asynchronous] == [prompts for prompts, _ in synchronous]


def test_iterations_that_take_their_responses_from_a_dataset_hand_out_no_prompts():
    """A learner's offline iterations (GKD's teacher batches) sample nothing: none is handed out for them, and the
    prompts are those of a synchronous run with the same offline iterations."""
    offline = {2, 3}
    synchronous = _run(0, 8, lambda step: step not in offline)
    asynchronous = _run(1, 8, lambda step: step not in offline)
    assert [prompts for prompts, _ in asynchronous] == [prompts for prompts, _ in synchronous]
    # iteration 4's rollout was not handed out at iteration 3, which sampled nothing: it samples fresh
    assert [version for _, version in asynchronous] == [0, 0, 4, 4, 5, 6]


# --- real runs: grpo_zero with its engines on Ray actors

GRPO = (
    "grpo.rewards={length: 1.0}",  # responses of a group differ in length from the start: every iteration updates
    "grpo.dynamic_sampling=false",
    "grpo.rollout_batch_size=8",
    "grpo.group_size=4",
    "grpo.minibatch_size=32",
    "grpo.max_new_tokens=24",
    "grpo.warmup_steps=0",
    "grpo.actor_lr=0.003",
    "grpo.rollout_engines=2",
    "grpo.roles.rollout.num_cpus=0.5",
)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    path = make_project(tmp_path_factory.mktemp("project"))
    for stage in ("data", "base"):
        subprocess.run(["alignflow", "stage", stage], cwd=path, env=warm(), check=True, capture_output=True)
    yield path
    ray.shutdown()


def _grpo_zero(project, *overrides: str) -> dict[str, list[float]]:
    """grpo_zero in this process; every metric it logged, by iteration."""
    with contextlib.chdir(project):
        params = load_params("params.yaml", [*GRPO, *overrides])
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            run_stage("grpo_zero", params)
    plots = project / "metrics/grpo_zero/plots/metrics/train"
    return {
        str(path.relative_to(plots).with_suffix("")): [
            float(row.split("\t")[-1]) for row in path.read_text().splitlines()[1:]
        ]
        for path in plots.rglob("*.tsv")
    }


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [1, 2])
def test_the_engines_sample_ahead_with_the_weights_of_max_staleness_iterations_before(project, staleness):
    """The rollouts of iterations 0..max_staleness all come from the starting weights: they are the rollouts of a
    run whose engines never take the actor's weights (the same engine seeds, the same prompts); later ones come
    from synced weights. The gap is logged (mismatch_kl) and weighed (auto: token weights)."""
    steps = staleness + 3
    frozen = _grpo_zero(project, f"grpo.steps={steps}", "grpo.sync_every=1000")
    ahead = _grpo_zero(project, f"grpo.steps={steps}", f"grpo.max_staleness={staleness}")
    assert ahead["staleness"] == [min(step, staleness) for step in range(steps)]
    assert ahead["response_length"][: staleness + 1] == frozen["response_length"][: staleness + 1]
    assert ahead["response_length"][staleness + 1 :] != frozen["response_length"][staleness + 1 :]
    # the first rollout is the starting policy's, as the actor is; later ones lag it
    assert ahead["mismatch_kl"][0] < 1e-4 < min(ahead["mismatch_kl"][1:])
    assert all(0 < weight <= 2 for weight in ahead["is_weight"])


@pytest.mark.slow
def test_an_asynchronous_run_killed_mid_run_resumes_to_the_uninterrupted_runs_bits(project):
    """A checkpoint keeps the rollouts in flight: the resumed run trains on the very samples the uninterrupted one
    did."""
    command = ["alignflow", "stage", "grpo_zero", *GRPO, "grpo.steps=4", "grpo.save_every=1", "grpo.max_staleness=1"]
    model = project / "artifacts/grpo_zero/model.safetensors"
    first = subprocess.run(command, cwd=project, env=warm(), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    uninterrupted = load_file(model)
    checkpoints = project / ".alignflow/checkpoints/grpo_zero"
    kill_at_first_checkpoint(command, project, checkpoints)
    time.sleep(1)  # the engine actors end with the stage's Ray, within a fraction of a second
    resumed = subprocess.run(command, cwd=project, env=warm(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "grpo_zero: resuming from the checkpoint at step" in resumed.stdout + resumed.stderr
    weights = load_file(model)
    assert weights.keys() == uninterrupted.keys()
    assert all((weights[name] == uninterrupted[name]).all() for name in weights)
