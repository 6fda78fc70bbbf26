"""Data-parallel training on Ray workers with torch.distributed (gloo on CPU): two workers train what one does
(SFT, DPO, the reward model, the RL actor), FSDP2's gradients are DDP's, and a checkpoint resumes on another number
of workers (a minute or two)."""

import contextlib
import io
import os
import re
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path

import pytest
import ray
import ray.cloudpickle
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from flows.local_server import free_port
from tasks.common.cluster import connect_ray
from tasks.common.config import ConfigError, ParallelConfig, Params, RewardModelConfig, StageResources
from tasks.common.distributed import Rank, WorkerLost, data_parallel, run_data_parallel
from tasks.common.registry import run_stage
from tasks.common.training import Checkpointer
from tasks.data.datasets import PreferencePair, read_examples, write_jsonl
from tasks.params.load import load_params
from tasks.rl.placement import check_engines_fit
from tasks.stages.reward_model import train_member
from tests.conftest import ENV, kill_at_first_checkpoint, make_project, warm
from tests.stage_env import stop_ray_nodes

pytestmark = pytest.mark.slow

STEPS = ("sft.max_steps=20", "sft.log_every=1", "sft.save_every=10", "sft.warmup_steps=2")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A tiny project with its data and base model built."""
    path = make_project(tmp_path_factory.mktemp("project"), STEPS)
    for stage in ("data", "base"):
        subprocess.run(["alignflow", "stage", stage], cwd=path, env=warm(), check=True, capture_output=True)
    yield path
    ray.shutdown()


def _train(project, stage: str, *overrides: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Run a training stage in this process (one Ray for every run of the module); its loss at every step and its
    final weights."""
    with contextlib.chdir(project):
        params = load_params("params.yaml", overrides)
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            run_stage(stage, params)
    rows = (project / f"metrics/{stage}/plots/metrics/train/loss.tsv").read_text().splitlines()[1:]
    return [float(row.split("\t")[-1]) for row in rows], load_file(project / f"artifacts/{stage}/model.safetensors")


@pytest.fixture(scope="module")
def one_worker(project) -> tuple[list[float], dict[str, torch.Tensor]]:
    return _train(project, "sft", "sft.parallel.num_workers=1")


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tolerance: float) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=tolerance, atol=tolerance) for k in a)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_workers_train_what_one_does_and_repeat_their_own_bits(project, one_worker, strategy):
    one_losses, one = one_worker
    two_losses, two = _train(project, "sft", "sft.parallel.num_workers=2", f"sft.parallel.strategy={strategy}")
    assert len(one_losses) == len(two_losses) == 20
    assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(one_losses, two_losses, strict=True)), (
        one_losses,
        two_losses,
    )
    assert _close(one, two, 1e-5)
    if strategy == "ddp":
        _, again = _train(project, "sft", "sft.parallel.num_workers=2")
        assert all(torch.equal(two[k], again[k]) for k in two)  # a fixed world size: the same bits


@pytest.mark.parametrize(("written", "strategy", "resumed"), [(2, "fsdp", 1), (1, "ddp", 2)])
def test_a_checkpoint_resumes_on_another_number_of_workers(project, one_worker, written, strategy, resumed):
    """Killed mid-run with ``written`` workers, resumed with ``resumed``: the one-worker run's weights (to float
    rounding: the same global batches, data position and schedule), whoever wrote the checkpoint."""
    checkpoints = project / ".alignflow/checkpoints/sft"
    every_step = ["sft.save_every=1"]  # a checkpoint every step: the kill lands mid-run
    writer = ["alignflow", "stage", "sft", f"sft.parallel.num_workers={written}", f"sft.parallel.strategy={strategy}"]
    kill_at_first_checkpoint([*writer, *every_step], project, checkpoints)
    time.sleep(1)  # the workers end with the stage's process, within a fraction of a second
    step = torch.load(next(checkpoints.glob("*/latest.pt")), weights_only=False)["step"]
    assert 0 < step < 20
    resume = ["alignflow", "stage", "sft", f"sft.parallel.num_workers={resumed}", *every_step]
    ran = subprocess.run(resume, cwd=project, env=warm(), capture_output=True, text=True)
    assert ran.returncode == 0 and f"resuming from the checkpoint at step {step}" in ran.stdout + ran.stderr
    assert _close(load_file(project / "artifacts/sft/model.safetensors"), one_worker[1], 1e-5)


GRPO = (
    "grpo.rewards={length: 1.0}",  # responses of a group differ in length from the start: every iteration updates
    "grpo.dynamic_sampling=false",
    "grpo.rollout_batch_size=8",
    "grpo.group_size=4",
    "grpo.minibatch_size=16",  # two actor updates per iteration, each split over the workers
    "grpo.max_new_tokens=24",
    "grpo.warmup_steps=0",
    "grpo.actor_lr=0.001",
    "grpo.parallel.cpus_per_worker=0.5",
    "grpo.roles.rollout.num_cpus=0.5",
)


def _grpo_zero(project, *overrides: str) -> tuple[dict[str, list[float]], dict[str, torch.Tensor]]:
    """Run grpo_zero (GRPO from the base model) in this process; every metric it logged, by iteration, and its
    final weights."""
    with contextlib.chdir(project):
        params = load_params("params.yaml", [*GRPO, *overrides])
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            run_stage("grpo_zero", params)
    plots = project / "metrics/grpo_zero/plots/metrics/train"
    logged = {
        str(path.relative_to(plots).with_suffix("")): [
            float(row.split("\t")[-1]) for row in path.read_text().splitlines()[1:]
        ]
        for path in plots.rglob("*.tsv")
    }
    return logged, load_file(project / "artifacts/grpo_zero/model.safetensors")


def test_grpo_with_two_actor_workers_and_two_rollout_engines_keeps_every_engine_in_parity(project):
    logged, _ = _grpo_zero(project, "grpo.steps=5", "grpo.parallel.num_workers=2", "grpo.rollout_engines=2")
    assert len(logged["reward"]) == 5
    for engine in ("engine_0", "engine_1"):
        parity = logged[f"logprob_parity_{engine}"]
        # each iteration samples with the weights synced after the one before: the actor's numbers, on both
        assert len(parity) == 5 and max(parity) <= 1e-3, (engine, parity)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_actor_workers_take_the_one_worker_update(project, strategy):
    """The same engines (and so the same first rollout) with one actor worker and with two: the same policy loss
    and, after two iterations of two updates each, the same weights (to float rounding)."""
    engines = ("grpo.steps=2", "grpo.rollout_engines=2")
    one, one_weights = _grpo_zero(project, *engines)
    two, two_weights = _grpo_zero(
        project, *engines, "grpo.parallel.num_workers=2", f"grpo.parallel.strategy={strategy}"
    )
    assert len(one["policy_loss"]) == 2
    for name in ("policy_loss", "entropy", "grad_norm"):
        assert all(abs(a - b) <= 1e-5 * max(abs(a), 1e-3) for a, b in zip(one[name], two[name], strict=True)), (
            name,
            one[name],
            two[name],
        )
    assert _close(one_weights, two_weights, 1e-5)


def test_two_reward_model_workers_train_what_one_does(project):
    """Bradley-Terry on pairs of (solution, wrong answer): two workers, each with half of every batch of pairs,
    end at one worker's weights and log its loss curve."""
    with contextlib.chdir(project):
        examples = read_examples(Path("artifacts/data/train.jsonl"))[:32]
        pairs = [PreferencePair(e.prompt, e.solution, e.solution[::-1]) for e in examples]
        cfg = RewardModelConfig(backbone="base", batch_size=8, epochs=1, warmup_steps=1, log_every=1)
        params = Params(seed=0, device="cpu")
        runs = {}
        for workers in (1, 2):
            parallel = ParallelConfig(num_workers=workers, cpus_per_worker=0.5)
            out = Path(f"reward-{workers}")
            checkpointer = Checkpointer(f"reward-{workers}", {}, [])
            backbone = Path("artifacts/base")
            history = train_member(params, replace(cfg, parallel=parallel), backbone, 0, pairs, out, checkpointer)
            checkpointer.clear()
            runs[workers] = ([metrics["loss"] for _, metrics in history], load_file(out / "model.safetensors"))
    (one_losses, one), (two_losses, two) = runs[1], runs[2]
    assert len(one_losses) == len(two_losses) == 4
    assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(one_losses, two_losses, strict=True))
    assert _close(one, two, 1e-5)


DPO = ("dpo.init=base", "dpo.max_steps=6", "dpo.log_every=1", "dpo.warmup_steps=1", "dpo.parallel.cpus_per_worker=0.5")


@pytest.fixture(scope="module")
def dpo_one_worker(project) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Pairs of (solution, its reverse), the base model's reference log-probs of them, and DPO on one worker."""
    preferences = project / "artifacts/preferences"
    preferences.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 32), ("test", 8)):
        examples = read_examples(project / f"artifacts/data/{split}.jsonl")[:count]
        write_jsonl(
            preferences / f"{split}.jsonl", [PreferencePair(e.prompt, e.solution, e.solution[::-1]) for e in examples]
        )
    with contextlib.chdir(project), redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        run_stage("dpo_reference", load_params("params.yaml", DPO))
    return _train(project, "dpo", *DPO)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_dpo_workers_train_what_one_does(project, dpo_one_worker, strategy):
    """A DPO step runs the policy once per shared prompt and once per response bucket (DDP wraps the whole step;
    FSDP runs one pass): two workers, each with half of every batch of pairs, log one worker's loss curve and end
    at its weights."""
    one_losses, one = dpo_one_worker
    two_losses, two = _train(project, "dpo", *DPO, "dpo.parallel.num_workers=2", f"dpo.parallel.strategy={strategy}")
    assert len(one_losses) == len(two_losses) == 6
    assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(one_losses, two_losses, strict=True)), (
        one_losses,
        two_losses,
    )
    assert _close(one, two, 1e-5)


def _gradients_after_one_step(strategy: str, rank: Rank) -> dict[str, torch.Tensor]:
    """Every parameter's full gradient after one backward of this rank's half of a fixed batch."""
    torch.manual_seed(0)
    size = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, tie_word_embeddings=True, **size))
    replica = data_parallel(model, strategy, rank)
    batch = torch.randint(0, 32, (4, 12), generator=torch.Generator().manual_seed(1))
    rows = batch[rank.slice(len(batch))]
    logits = replica(input_ids=rows).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 32), rows[:, 1:].reshape(-1))
    loss.backward()
    return {
        name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
        for name, p in model.named_parameters()
    }


def test_fsdp_gradients_are_ddps(project):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import the tests
    two = ParallelConfig(num_workers=2, cpus_per_worker=0.5)
    ddp = run_data_parallel(lambda rank: _gradients_after_one_step("ddp", rank), two, "test.parallel")
    fsdp = run_data_parallel(
        lambda rank: _gradients_after_one_step("fsdp", rank),
        ParallelConfig(**{**two.__dict__, "strategy": "fsdp"}),
        "t",
    )
    single = _gradients_after_one_step("ddp", Rank())  # the whole batch in one process: the mean over both halves
    assert ddp.keys() == fsdp.keys() == single.keys()
    for name in ddp:
        assert torch.allclose(fsdp[name], ddp[name], rtol=1e-6, atol=1e-6), name  # averaged, not summed
        assert torch.allclose(ddp[name], single[name], rtol=1e-5, atol=1e-6), name


def _lose_rank_one(rank: Rank) -> int:
    if rank.rank == 1:
        os._exit(1)  # as a worker whose node went away
    torch.distributed.barrier()  # rank 0 waits on the lost one, as in a collective of a training step
    return 0


def test_a_lost_worker_fails_with_its_name_and_too_many_workers_fail_at_once(project):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with pytest.raises(WorkerLost, match=r"worker 1 of 2 on .* was lost"):
        run_data_parallel(_lose_rank_one, ParallelConfig(num_workers=2, cpus_per_worker=0.5), "sft.parallel")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"sft.parallel.num_workers: 3 workers of .* do not fit this Ray cluster"):
        run_data_parallel(_lose_rank_one, ParallelConfig(num_workers=3, cpus_per_worker=8), "sft.parallel")
    assert time.monotonic() - started < 60


def test_rollout_engines_the_cluster_cannot_hold_are_refused_naming_the_key(project):
    connect_ray(Params().runner)
    cpus = int(ray.cluster_resources()["CPU"])
    check_engines_fit(cpus, StageResources(num_cpus=1), "grpo")  # as many as there are CPUs: they fit
    with pytest.raises(ConfigError, match=rf"grpo.rollout_engines: {cpus + 1} engines of grpo.roles.rollout .* CPU"):
        check_engines_fit(cpus + 1, StageResources(num_cpus=1), "grpo")


def test_two_ray_nodes_on_loopback_each_run_one_worker(project):
    ray.shutdown()  # the test process's own Ray, from the tests before
    port = free_port()
    env = {**ENV, "RAY_AUTH_MODE": "disabled", "GLOO_SOCKET_IFNAME": "lo"}  # gloo would bind by hostname
    start = ["ray", "start", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats"]
    try:
        # One "trainer" slot per node: two workers that each need one cannot share a node.
        head = [*start, "--head", f"--port={port}", "--include-dashboard=false", '--resources={"trainer": 1}']
        subprocess.run(head, env=env, check=True, capture_output=True)
        second = [*start, f"--address=127.0.0.1:{port}", '--resources={"trainer": 1}']
        subprocess.run(second, env=env, check=True, capture_output=True)
        ran = subprocess.run(
            [
                "alignflow",
                "stage",
                "sft",
                "sft.parallel.num_workers=2",
                "sft.parallel.resources_per_worker={trainer: 1}",
            ],
            cwd=project,
            env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"},
            capture_output=True,
            text=True,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        placed = re.search(r"rank by rank on (.*)", ran.stdout + ran.stderr)
        assert placed, ran.stdout[-2000:] + ran.stderr[-2000:]
        placed = placed.group(1)
        nodes = re.findall(r"Ray node (\w+)", placed)
        assert len(nodes) == 2 and nodes[0] != nodes[1], placed  # one worker on each node
    finally:
        stop_ray_nodes(port)
