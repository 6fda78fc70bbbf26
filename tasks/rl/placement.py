"""Where an RL stage's roles run.

``place`` puts each role (``tasks/rl/workers.py``) in this process (``colocate``), on its own Ray actor with the
resources ``roles`` gives it, or, for the trained roles with ``parallel.num_workers`` > 1, on a group of
data-parallel Ray workers (``RoleGroup``: every rank runs every call, each on its share of the rows, gradients
averaged over the ranks), and hands the trainer a typed handle for each (``tasks/rl/role_handles.py``), the same
wherever the role runs. The rollout role samples through the engine in the actor's process or through the
replicas apart from it (``tasks/rollout/engine_group.py``), with one call either way, ``sample(examples)``: their
responses, or, for a task with tools or an environment, their episodes, played where the engine is.
"""

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasks.common.config import ConfigError, Params, RLConfig, StageResources, engine_in_actor
from tasks.common.distributed import RoleGroup
from tasks.rl.reward_role import RewardWorker
from tasks.rl.role_handles import (
    ActorEngine,
    ActorHandle,
    AdapterReference,
    CriticHandle,
    FrozenHandle,
    Placed,
    RewardHandle,
    Roles,
    Worker,
)
from tasks.rl.workers import ActorWorker, CriticWorker, FrozenWorker
from tasks.rollout.engine_group import EngineGroup, EngineWorker

TRAINED_ROLES = ("actor", "critic")


def place(
    params: Params,
    cfg: RLConfig,
    policy_dir: Path,
    reward_dirs: list[Path],
    wanted: set[str],
    teacher_dir: Path | None = None,
    section: str = "rl",
) -> Roles:
    """Start the ``wanted`` roles (the actor always), colocated in this process or each on its own Ray actor; the
    trained ones on ``parallel.num_workers`` data-parallel workers (``section`` names their params in errors);
    and the rollout engines (``rollout``: the actor's own engine when it lives in its process)."""
    critic_dir = reward_dirs[0] if cfg.critic_init == "reward" and reward_dirs else policy_dir
    if not cfg.colocate or not engine_in_actor(cfg):
        from tasks.common.cluster import connect_ray

        connect_ray(params.runner)

    started: list[Any] = []  # in place before each starts: a failure releases those already up

    def start(name: str, role: type, *args: Any) -> Placed:
        if name in TRAINED_ROLES and cfg.parallel.num_workers > 1:
            placed = RoleGroup(role, args, cfg.parallel, f"{section}.parallel")
        else:
            placed = Worker(role, args, None if cfg.colocate else cfg.roles.get(name, StageResources()))
        started.append(placed)
        return placed

    def start_engine(replica: int, resources: StageResources) -> Worker:
        """A rollout engine apart from the actor: on a Ray actor of its own, colocated stage or not."""
        started.append(Worker(EngineWorker, (params, cfg, policy_dir, replica), resources))
        return started[-1]

    try:
        actor = ActorHandle(start("actor", ActorWorker, params, cfg, policy_dir))
        roles = Roles(actor=actor, rollout=ActorEngine(actor))
        if "critic" in wanted:
            roles.critic = CriticHandle(start("critic", CriticWorker, params, cfg, critic_dir))
        if "reference" in wanted:
            adapted = bool(cfg.lora.rank)
            reference = AdapterReference(actor.placed) if adapted else None
            roles.reference = reference or FrozenHandle(start("reference", FrozenWorker, params, cfg, policy_dir))
        if "reward" in wanted:
            roles.reward = RewardHandle(start("reward", RewardWorker, params, cfg, reward_dirs, policy_dir))
        if "teacher" in wanted:
            roles.teacher = FrozenHandle(start("teacher", FrozenWorker, params, cfg, teacher_dir))
        if not engine_in_actor(cfg):
            resources = cfg.roles.get("rollout", StageResources())
            check_engines_fit(cfg.rollout_engines, resources, section)
            roles.rollout = engines = EngineGroup([])
            engines.replicas += [start_engine(replica, resources) for replica in range(cfg.rollout_engines)]
    except BaseException:
        for placed in started:
            placed.close()
        raise
    return roles


def check_engines_fit(engines: int, resources: StageResources, section: str) -> None:
    """Ray would leave engines that the cluster cannot hold pending forever: refuse them, naming the key."""
    import ray

    needed = {"CPU": resources.num_cpus, "GPU": resources.num_gpus, "memory": resources.memory_gb * 2**30}
    total = ray.cluster_resources()
    short = [name for name, amount in needed.items() if amount and amount * engines > total.get(name, 0)]
    if short:
        raise ConfigError(
            f"{section}.rollout_engines: {engines} engines of {section}.roles.rollout ({needed}) need more "
            f"{', '.join(short)} than this Ray cluster has in all ({ {name: total.get(name, 0) for name in short} })"
        )


@contextlib.contextmanager
def placed(*args: Any, **kwargs: Any) -> Iterator[Roles]:
    """``place``'s roles, released on exit."""
    roles = place(*args, **kwargs)
    try:
        yield roles
    finally:
        roles.close()
