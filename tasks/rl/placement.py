"""Where an RL stage's roles run, and how the trainer calls them.

``place`` puts each role (``tasks/rl/workers.py``) in this process (``colocate``), on its own Ray actor with the
resources ``roles`` gives it, or, for the trained roles with ``parallel.num_workers`` > 1, on a group of
data-parallel Ray workers (``RoleGroup``: every rank runs every call, each on its share of the rows, gradients
averaged over the ranks). The trainer calls all of them the same way, ``role.call(method, *args)``, which returns
at once (a Ray actor's method is addressed by name); ``.result()`` waits, so calls on different roles run
concurrently. The rollout role samples through the engine in the actor's process or through the replicas apart
from it (``tasks/rollout/engine_group.py``), with plain calls either way: ``generate(prompts)``, or, for a task
with tools or an environment (its ``episodes``), ``play(examples)``, which plays their episodes where the engine is.
"""

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasks.common.config import ConfigError, Params, RLConfig, StageResources, engine_in_actor
from tasks.common.distributed import RoleGroup
from tasks.data.problems import Example
from tasks.rl.reward_role import RewardWorker
from tasks.rl.workers import ActorWorker, CriticWorker, FrozenWorker
from tasks.rollout.engine_group import EngineGroup, EngineWorker

TRAINED_ROLES = ("actor", "critic")
# The placed roles by name: each a Worker or a RoleGroup, but "rollout", an ActorEngine or an EngineGroup.
Roles = dict[str, Any]


class Pending:
    """A call's result: already computed (colocated) or a Ray object to fetch."""

    def __init__(self, value: Any, remote: bool):
        self.value, self.remote = value, remote

    def result(self) -> Any:
        if not self.remote:
            return self.value
        import ray  # Ray only where a role runs on it: colocated roles load and run without it

        return ray.get(self.value)

    def ref(self) -> Any:
        """The result as it is, to hand to another role: a Ray object stays unfetched."""
        return self.value


class Worker:
    """One role, in this process or on a Ray actor; ``call`` returns a Pending either way."""

    def __init__(self, role: type, args: tuple, resources: StageResources | None):
        if resources is None:
            self.handle, self.remote = role(*args), False
        else:
            import ray

            actor = ray.remote(role).options(
                num_cpus=resources.num_cpus,
                num_gpus=resources.num_gpus,
                memory=int(resources.memory_gb * 2**30) or None,
            )
            self.handle, self.remote = actor.remote(*args), True

    def call(self, method: str, *args: Any) -> Pending:
        if self.remote:
            return Pending(getattr(self.handle, method).remote(*args), remote=True)
        return Pending(getattr(self.handle, method)(*args), remote=False)

    def close(self) -> None:
        if self.remote:
            import ray

            ray.kill(self.handle)


class ActorEngine:
    """The rollout engine that lives in the actor's process (``engine_in_actor``): it samples from the actor's
    own weights, so it takes none after an update."""

    apart = False

    def __init__(self, actor: Worker | RoleGroup, episodes: bool = False):
        self.actor, self.episodes = actor, episodes

    def generate(self, prompts: list[str]) -> Pending:
        return self.actor.call("generate", prompts)

    def play(self, examples: list[Example]) -> Pending:
        return self.actor.call("play", examples)

    def close(self) -> None:
        """Nothing of its own to stop: the actor is released as itself."""


class AdapterReference:
    """The reference of a policy that trains through LoRA adapters: the actor's own model with its adapters
    disabled (``ActorWorker.reference_logprobs``), not a second copy in memory."""

    def __init__(self, actor: Worker | RoleGroup):
        self.actor = actor

    def call(self, method: str, *args: Any) -> Pending:
        return self.actor.call(f"reference_{method}", *args)

    def close(self) -> None:
        """Nothing of its own to stop: the actor is released as itself."""


def place(
    params: Params,
    cfg: RLConfig,
    policy_dir: Path,
    reward_dirs: list[Path],
    wanted: set[str],
    teacher_dir: Path | None = None,
    section: str = "rl",
    episodes: bool = False,
) -> Roles:
    """Start the ``wanted`` roles (the actor always), colocated in this process or each on its own Ray actor; the
    trained ones on ``parallel.num_workers`` data-parallel workers (``section`` names their params in errors);
    and the rollout engines (``rollout``: the actor's own engine when it lives in its process), which play
    ``episodes`` when the task has tools or an environment."""
    critic_dir = reward_dirs[0] if cfg.critic_init == "reward" and reward_dirs else policy_dir
    roles = {
        "actor": (ActorWorker, (params, cfg, policy_dir)),
        "critic": (CriticWorker, (params, cfg, critic_dir)),
        "reference": (FrozenWorker, (params, cfg, policy_dir)),
        "reward": (RewardWorker, (params, cfg, reward_dirs, policy_dir)),
        "teacher": (FrozenWorker, (params, cfg, teacher_dir)),
    }
    if not cfg.colocate or not engine_in_actor(cfg):
        from tasks.common.cluster import connect_ray

        connect_ray(params.runner)

    def start(name: str, role: type, args: tuple) -> Worker | RoleGroup:
        if name in TRAINED_ROLES and cfg.parallel.num_workers > 1:
            return RoleGroup(role, args, cfg.parallel, f"{section}.parallel")
        return Worker(role, args, None if cfg.colocate else cfg.roles.get(name, StageResources()))

    started: Roles = {}
    try:
        adapter_reference = bool(cfg.lora.rank)
        for name, (role, args) in roles.items():
            if name == "actor" or (name in wanted and not (name == "reference" and adapter_reference)):
                started[name] = start(name, role, args)
        if adapter_reference and "reference" in wanted:
            started["reference"] = AdapterReference(started["actor"])
        if engine_in_actor(cfg):
            started["rollout"] = ActorEngine(started["actor"], episodes)
        else:
            resources = cfg.roles.get("rollout", StageResources())
            check_engines_fit(cfg.rollout_engines, resources, section)
            # in place before they start: a failure releases them
            engines = started["rollout"] = EngineGroup([], episodes)
            for replica in range(cfg.rollout_engines):
                engines.replicas.append(Worker(EngineWorker, (params, cfg, policy_dir, replica), resources))
    except BaseException:
        release(started)
        raise
    return started


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


def release(roles: Roles) -> None:
    """Stop the roles that run on Ray actors."""
    for role in roles.values():
        role.close()


@contextlib.contextmanager
def placed(*args: Any, **kwargs: Any) -> Iterator[Roles]:
    """``place``'s roles, released on exit."""
    roles = place(*args, **kwargs)
    try:
        yield roles
    finally:
        release(roles)
