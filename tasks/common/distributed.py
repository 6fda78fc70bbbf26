"""Data-parallel training on Ray: N workers in a placement group, joined in one torch.distributed group.

Our own placement group and ``init_process_group`` rather than Ray Train's ``TorchTrainer``: a stage already runs
inside a Ray task of the flow (or alone under ``dvc repro``), keeps its checkpoints and its output directory
itself, and needs only what TorchTrainer's first step does (place, rendezvous), not its run loop, its
checkpoint store or its result reporting. Each worker:

- sets its own thread count (Ray sets one OMP thread per worker; the stage's bits depend on the count);
- rendezvous over TCP at rank 0's node address (gloo on CPU, NCCL on GPU), so nothing binds by hostname;
- runs the same function with its rank (``run_data_parallel``: rank 0's return value is the stage's), or holds
  one rank of a role that lives as long as the stage and answers calls (``RoleGroup``: an RL stage's actor or
  critic, every call run on every rank).

A placement the cluster cannot satisfy is an error naming the key within ``PLACEMENT_SECONDS``, not a hang; a
worker that dies fails the stage naming the worker and its node (the last checkpoint stays where it was).
"""

import contextlib
import functools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from tasks.common.config import ConfigError, ParallelConfig

PLACEMENT_SECONDS = 60.0
_WATCH_SECONDS = 0.2
T = TypeVar("T")


@dataclass(frozen=True)
class Rank:
    """Where this process stands in its data-parallel group."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def slice(self, rows: int) -> slice:
        """This rank's contiguous share of ``rows`` (a multiple of the world size)."""
        share = rows // self.world_size
        return slice(self.rank * share, (self.rank + 1) * share)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` averaged over the ranks (itself in a group of one)."""
        return self.sum(value) / self.world_size if self.world_size > 1 else value

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over the ranks: rows each rank filled in a tensor of zeros become the whole tensor."""
        if self.world_size == 1:
            return value
        value = value.detach().clone()
        dist.all_reduce(value)
        return value

    def share(self, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        """This rank's share of ``rows`` (1-D indices, split as evenly as they go) and its weight: the share's
        fraction of the rows times the world size. A rank's loss normalised over its share, times the weight, and
        averaged over the ranks is the loss normalised over all the rows; its gradient too. A rank left without
        rows (fewer rows than ranks) runs the first row with weight 0, so that every rank takes part in the step."""
        if self.world_size == 1:
            return rows, 1.0
        mine = rows.tensor_split(self.world_size)[self.rank]
        if len(mine) == 0:
            return rows[:1], 0.0
        return mine, len(mine) * self.world_size / len(rows)

    def average_gradients(self, model: torch.nn.Module) -> None:
        """Average a replicated model's gradients over the ranks, in one all-reduce (a sharded model's are already
        reduced by FSDP)."""
        if self.world_size == 1 or is_sharded(model):
            return
        parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        for parameter, part in zip(parameters, flat.split([grad.numel() for grad in grads]), strict=True):
            parameter.grad = part.view_as(parameter).clone()

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (so that every rank takes the same branch)."""
        if self.world_size == 1:
            return flag
        return bool(self.sum(torch.tensor(float(flag))) > 0)


SINGLE = Rank()


class WorkerLost(RuntimeError):
    pass


def data_parallel(model: torch.nn.Module, strategy: str, rank: Rank) -> torch.nn.Module:
    """The module this rank runs forward and backward through: ``model`` itself alone; DDP (a full replica,
    gradients averaged during backward); or FSDP2, each decoder block and then the rest sharded in place
    (``model``'s parameters become DTensor shards)."""
    from torch.nn.parallel import DistributedDataParallel

    if rank.world_size == 1:
        return model
    if strategy == "ddp":
        return DistributedDataParallel(model)
    return shard_in_place(model)


class _Step(torch.nn.Module):
    """``step(model, *args)`` as a module's forward, for DDP to wrap whole."""

    def __init__(self, model: torch.nn.Module, step: Callable[..., Any]):
        super().__init__()
        self.model, self.step = model, step

    def forward(self, *args: Any) -> Any:
        return self.step(self.model, *args)


def data_parallel_step(
    model: torch.nn.Module, step: Callable[..., Any], strategy: str, rank: Rank
) -> Callable[..., Any]:
    """``step(model, *args)`` as this rank runs it: ``data_parallel`` for a step that needs more of the model than
    calls of it (DPO's shared-prompt pass reads the model's config and gradient-checkpointing flag, which DDP's
    wrapper does not have). With DDP, the wrapper holds the whole step instead, and still averages the gradients
    once, in backward; alone or with FSDP2 (sharded in place), it is ``step`` on ``model`` itself."""
    from torch.nn.parallel import DistributedDataParallel

    if strategy == "ddp" and rank.world_size > 1:
        return DistributedDataParallel(_Step(model, step))
    return functools.partial(step, data_parallel(model, strategy, rank))


def shard_in_place(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: each decoder block, then the rest, sharded over the process group (parameters become DTensors)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.model.layers:
        fully_shard(block)
    fully_shard(model)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The model's and optimiser's state in one process's format (the optimiser's keyed by parameter index), so a
    checkpoint resumes on any number of workers with any strategy. Sharded, it is gathered (a collective every rank
    calls; rank 0 gets it)."""
    if not is_sharded(model):
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights, moments = get_state_dict(model, optimizer, options=options)
    index = {name: i for i, name in enumerate(_parameter_names(model, optimizer))}
    return weights, _rekeyed(moments, index)


def load_training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, weights: dict, moments: dict) -> None:
    """Load what ``training_state`` returned (on any number of workers, any strategy)."""
    if not is_sharded(model):
        model.load_state_dict(weights)
        optimizer.load_state_dict(moments)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    name = dict(enumerate(_parameter_names(model, optimizer)))
    options = StateDictOptions(full_state_dict=True)
    set_state_dict(
        model, optimizer, model_state_dict=weights, optim_state_dict=_rekeyed(moments, name), options=options
    )


def _parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The optimiser's parameters' names, in the order a one-process state dict numbers them."""
    name_of = {id(parameter): name for name, parameter in model.named_parameters()}
    return [name_of[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]


def _rekeyed(moments: dict, key: dict) -> dict:
    """An optimiser state dict with each parameter's key replaced by ``key[...]`` (index <-> name); an empty one
    (a gathered state off rank 0) as it is."""
    if not moments:
        return moments
    return {
        "state": {key[k]: v for k, v in moments["state"].items()},
        "param_groups": [{**group, "params": [key[p] for p in group["params"]]} for group in moments["param_groups"]],
    }


def full_state_dict(model: torch.nn.Module, rank: Rank) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on rank 0 (None alone: the model's own state dict is that). Every rank must call
    it: gathering shards is a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if rank.world_size == 1:
        return None
    if not is_sharded(model):
        return model.state_dict()
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # Gathered, tied weights (embeddings and LM head) are copies: one tensor again under every name, so that
    # save_pretrained writes it once, as it does for the model it loaded.
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    for first, *aliases in names.values():
        for alias in aliases:
            if first in weights:
                weights[alias] = weights[first]
    return weights


def _exit_with(pid: int) -> None:
    """End this worker as soon as process ``pid`` (the stage, on this node) is gone: a killed or cancelled stage
    must not leave its workers training and writing checkpoints beside its rerun. (Ray kills the actors of a dead
    driver too, but only once it notices, seconds later; on another node, that is what stops them.)"""

    def watch() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(1)
            time.sleep(_WATCH_SECONDS)

    threading.Thread(target=watch, name="exit-with-stage", daemon=True).start()


class _Member:
    """A Ray actor (``ray.remote(_Member)``) holding one rank: of a group that runs one function (``run``), or of
    a role's group that lives as long as the stage (``build``, then ``call`` after ``call``)."""

    def address(self) -> tuple[str, int, str]:
        """This worker's node address, a free port there (rank 0's is the group's rendezvous), its Ray node id."""
        import ray

        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return ray.util.get_node_ip_address(), port, ray.get_runtime_context().get_node_id()

    def join(self, rank: int, world_size: int, master: tuple[str, int], threads: int, stage: tuple[str, int, str]):
        node, pid, cwd = stage
        import ray

        if node == ray.util.get_node_ip_address():
            _exit_with(pid)
        os.chdir(cwd)  # the stage's paths are relative to its project
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{master[0]}:{master[1]}", rank=rank, world_size=world_size)
        self.rank = Rank(rank, world_size)

    def run(self, fn: Callable[[Rank], Any]) -> Any:
        try:
            return fn(self.rank)
        finally:
            dist.destroy_process_group()

    def build(self, role: type, *args: Any) -> None:
        self.role = role(*args, rank=self.rank)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.role, method)(*args)


@contextlib.contextmanager
def _group(cfg: ParallelConfig, key: str) -> Iterator[tuple[list[Any], list[tuple[str, int, str]]]]:
    """``cfg.num_workers`` members placed, joined in one process group, and their nodes; gone on exit."""
    import ray
    from ray.util.placement_group import remove_placement_group

    from tasks.common.cluster import connect_ray
    from tasks.common.config import RunnerConfig

    connect_ray(RunnerConfig(), log_to_driver=True)  # RAY_ADDRESS when the flow runs the stage, else a local Ray
    group = _placement(cfg, key)
    members = []
    try:
        members = _start_members(group, cfg)
        # Each worker's node by the address Ray knows it by (a node started with --node-ip-address=127.0.0.1 is
        # reached there), a free port on it, and its id.
        known = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
        nodes = [(known.get(node, ip), port, node) for ip, port, node in ray.get([m.address.remote() for m in members])]
        placed = ", ".join(f"{ip} (Ray node {node[:12]})" for ip, _, node in nodes)
        print(f"{key}: {cfg.num_workers} workers ({cfg.strategy}), rank by rank on {placed}", flush=True)
        stage = (ray.util.get_node_ip_address(), os.getpid(), os.getcwd())
        joins = [
            member.join.remote(rank, cfg.num_workers, nodes[0][:2], cfg.threads_per_worker, stage)
            for rank, member in enumerate(members)
        ]
        _first_failure_or_results(joins, nodes)
        yield members, nodes
    finally:
        for member in members:
            ray.kill(member)
        remove_placement_group(group)


def run_data_parallel(fn: Callable[[Rank], T], cfg: ParallelConfig, key: str) -> T:
    """``fn(rank)`` on ``cfg.num_workers`` Ray workers joined in one process group; rank 0's result. One worker:
    ``fn(SINGLE)`` here, in this process, exactly as a stage ran before it could scale out. ``key`` names the
    params section (``sft.parallel``) in errors."""
    if cfg.num_workers == 1:
        return fn(SINGLE)
    with _group(cfg, key) as (members, nodes):
        return _first_failure_or_results([member.run.remote(fn) for member in members], nodes)[0]


class GroupCall:
    """A call running on every rank of a ``RoleGroup``."""

    def __init__(self, runs: list[Any], nodes: list[tuple[str, int, str]]):
        self.runs, self.nodes = runs, nodes

    def result(self) -> Any:
        """Rank 0's result, once every rank has finished (a failed or lost rank raises, naming it)."""
        return _first_failure_or_results(self.runs, self.nodes)[0]

    def ref(self) -> Any:
        """Rank 0's result as a Ray object, not fetched here: to hand to other actors (the policy's weights to the
        rollout engines), once every rank has finished."""
        _first_failure_or_results(self.runs, self.nodes, fetch_first=False)
        return self.runs[0]


class RoleGroup:
    """One role (the RL actor, the critic) on ``cfg.num_workers`` data-parallel ranks that live as long as the
    stage. Every call runs on every rank with the same arguments (each put in the object store once, not sent once
    per rank); the ranks take their own shares of a batch and meet in collectives, and the result is rank 0's."""

    def __init__(self, role: type, args: tuple, cfg: ParallelConfig, key: str):
        import ray

        self._exit = contextlib.ExitStack()
        self.members, self.nodes = self._exit.enter_context(_group(cfg, key))
        try:
            shared = [ray.put(arg) for arg in args]  # top-level arguments: Ray hands each rank the value
            GroupCall([member.build.remote(role, *shared) for member in self.members], self.nodes).result()
        except BaseException:
            self.close()
            raise

    def call(self, method: str, *args: Any) -> GroupCall:
        import ray

        shared = [ray.put(arg) if not isinstance(arg, ray.ObjectRef) else arg for arg in args]
        return GroupCall([member.call.remote(method, *shared) for member in self.members], self.nodes)

    def close(self) -> None:
        self._exit.close()


def _placement(cfg: ParallelConfig, key: str) -> Any:
    """A ready placement group of ``cfg.num_workers`` bundles; ConfigError naming ``key`` at once when the cluster
    can never hold them, or after ``PLACEMENT_SECONDS`` when what it has stays taken."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = {"CPU": cfg.cpus_per_worker, "GPU": cfg.gpus_per_worker, **cfg.resources_per_worker}
    if cfg.memory_gb_per_worker:
        bundle["memory"] = cfg.memory_gb_per_worker * 2**30
    bundle = {name: amount for name, amount in bundle.items() if amount}
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    fits = [all(node.get(name, 0) >= amount for name, amount in bundle.items()) for node in nodes]
    total = {name: sum(node.get(name, 0) for node in nodes) for name in bundle}
    short = [name for name, amount in bundle.items() if total[name] < amount * cfg.num_workers]
    if short or (cfg.placement == "STRICT_SPREAD" and sum(fits) < cfg.num_workers):
        raise ConfigError(
            f"{key}.num_workers: {cfg.num_workers} workers of {bundle} ({cfg.placement}) do not fit this Ray "
            f"cluster: {len(nodes)} node(s), {sum(fits)} with room for one, in all {total}"
        )
    group = placement_group([dict(bundle) for _ in range(cfg.num_workers)], strategy=cfg.placement)
    if not ray.wait([group.ready()], timeout=PLACEMENT_SECONDS)[0]:
        remove_placement_group(group)
        raise ConfigError(
            f"{key}.num_workers: {cfg.num_workers} workers of {bundle} ({cfg.placement}) found no room within "
            f"{PLACEMENT_SECONDS:g} s; free now: {ray.available_resources()}"
        )
    return group


def _start_members(group: Any, cfg: ParallelConfig) -> list[Any]:
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return [
        ray.remote(_Member)
        .options(
            num_cpus=cfg.cpus_per_worker,
            num_gpus=cfg.gpus_per_worker,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index),
        )
        .remote()
        for index in range(cfg.num_workers)
    ]


def _first_failure_or_results(
    runs: list[Any], nodes: list[tuple[str, int, str]], fetch_first: bool = True
) -> list[Any]:
    """Every worker's result, or the first failure as soon as it happens (the others would wait on it forever in
    their next collective): a lost worker is named with its node; a worker's exception is re-raised (rank 0's when
    it failed too, as it owns the checkpoint and the better message). ``fetch_first`` False leaves rank 0's result
    in the object store (None in its place): whoever it is handed to meets its failure, if any."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    pending = list(runs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, fetch_local=False)
        rank = runs.index(done[0])
        if rank == 0 and not fetch_first:
            continue
        try:
            ray.get(done[0])
        except RayActorError as error:
            node = f"{nodes[rank][0]} (Ray node {nodes[rank][2][:12]})"
            raise WorkerLost(
                f"worker {rank} of {len(runs)} on {node} was lost: {str(error).splitlines()[0]}; the stage's last "
                "checkpoint is kept, and a rerun resumes from it"
            ) from None
        except RayTaskError as error:
            if rank != 0 and ray.wait([runs[0]], timeout=30)[0]:
                try:
                    ray.get(runs[0])
                except RayTaskError as first:
                    raise first.as_instanceof_cause() from None
            raise error.as_instanceof_cause() from None
    return [ray.get(run) if rank or fetch_first else None for rank, run in enumerate(runs)]
