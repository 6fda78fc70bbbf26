"""How the RL loop calls its roles: a typed handle per role, whose methods are the role's own.

A role (``tasks/rl/workers.py``, ``tasks/rl/reward_role.py``) runs in this process, on a Ray actor, or on a
group of data-parallel Ray workers (``RoleGroup``); each of those runs a method named in a message. The trainer
never names one in a string: it calls ``roles.actor.update(batch, loss, rows, old_logprobs)``, and each handle
method hands its worker's method (``ActorWorker.update``, where a reader's go-to-definition lands) to the role
wherever it runs. Every call returns at once, a ``Pending``; ``.result()`` waits, so calls on different roles run
concurrently.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from tasks.common.config import StageResources
from tasks.common.distributed import RoleGroup
from tasks.data.problems import Example
from tasks.rl.reward_role import RewardWorker
from tasks.rl.sequences import PackedBatch
from tasks.rl.workers import ActorLoss, ActorWorker, CriticWorker, FrozenWorker
from tasks.rollout.engine import Completion, Sampling
from tasks.rollout.engine_group import EngineGroup

T = TypeVar("T")
Weights = dict[str, torch.Tensor]


class Pending(Generic[T]):
    """A call's result: already computed (colocated) or a Ray object to fetch."""

    def __init__(self, value: Any, remote: bool):
        self.value, self.remote = value, remote

    def result(self) -> T:
        if not self.remote:
            return self.value
        import ray  # Ray only where a role runs on it: colocated roles load and run without it

        return ray.get(self.value)

    def ref(self) -> Any:
        """The result as it is, to hand to another role: a Ray object stays unfetched."""
        return self.value


class Worker:
    """One role's process: this one, or a Ray actor with ``resources``; ``call`` runs a method of the role there."""

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


Placed = Worker | RoleGroup


class _Handle:
    """A placed role; ``_run(Worker.method, *args)`` runs that method wherever the role lives."""

    def __init__(self, placed: Placed):
        self.placed = placed

    def _run(self, method: Callable[..., T], *args: Any) -> Pending[T]:
        return self.placed.call(method.__name__, *args)

    @property
    def remote(self) -> bool:
        """Whether the role runs apart from this process (a Ray actor, or a group of them)."""
        return isinstance(self.placed, RoleGroup) or self.placed.remote

    @property
    def local(self) -> Any:
        """The role's own object, when it runs in this process: tests and benches look inside it."""
        if self.remote:
            raise ValueError(f"{type(self).__name__}: the role runs on Ray, not in this process")
        return self.placed.handle

    def close(self) -> None:
        self.placed.close()


class ActorHandle(_Handle):
    """The policy (``ActorWorker``)."""

    def logprobs(self, batch: PackedBatch) -> Pending[torch.Tensor]:
        return self._run(ActorWorker.logprobs, batch)

    def update(
        self,
        batch: PackedBatch,
        loss: ActorLoss,
        rows: dict[str, torch.Tensor | None],
        old_logprobs: torch.Tensor | None = None,
    ) -> Pending[tuple[dict[str, float], torch.Tensor]]:
        return self._run(ActorWorker.update, batch, loss, rows, old_logprobs)

    def sample_current(self, prompts: list[str], sampling: Sampling, seed: int) -> Pending[list[Completion]]:
        return self._run(ActorWorker.sample_current, prompts, sampling, seed)

    def sample(self, examples: list[Example]) -> Pending[list[Completion]]:
        return self._run(ActorWorker.sample, examples)

    def weights(self) -> Pending[Weights | None]:
        return self._run(ActorWorker.weights)

    def weights_for_engines(self) -> Pending[Weights | None]:
        return self._run(ActorWorker.weights_for_engines)

    def restore(self, weights: Weights) -> Pending[None]:
        return self._run(ActorWorker.restore, weights)

    def state(self) -> Pending[dict[str, Any] | None]:
        return self._run(ActorWorker.state)

    def load_state(self, state: dict[str, Any]) -> Pending[None]:
        return self._run(ActorWorker.load_state, state)

    def save(self, out: Path, tokenizer_dir: Path) -> Pending[None]:
        return self._run(ActorWorker.save, out, tokenizer_dir)


class CriticHandle(_Handle):
    """The value model (``CriticWorker``)."""

    def values(self, batch: PackedBatch) -> Pending[torch.Tensor]:
        return self._run(CriticWorker.values, batch)

    def update(self, batch: PackedBatch, old_values: torch.Tensor, returns: torch.Tensor) -> Pending[dict[str, float]]:
        return self._run(CriticWorker.update, batch, old_values, returns)

    def state(self) -> Pending[dict[str, Any] | None]:
        return self._run(CriticWorker.state)

    def load_state(self, state: dict[str, Any]) -> Pending[None]:
        return self._run(CriticWorker.load_state, state)


class FrozenHandle(_Handle):
    """A model that is not trained (``FrozenWorker``): the reference, the teacher."""

    def logprobs(self, batch: PackedBatch) -> Pending[torch.Tensor]:
        return self._run(FrozenWorker.logprobs, batch)

    def logits(self, batch: PackedBatch) -> Pending[torch.Tensor]:
        return self._run(FrozenWorker.logits, batch)

    def weights(self) -> Pending[Weights]:
        return self._run(FrozenWorker.weights)

    def load_weights(self, weights: Weights) -> Pending[None]:
        return self._run(FrozenWorker.load_weights, weights)


class AdapterReference(_Handle):
    """The reference of a policy that trains through LoRA adapters: the actor's own model with its adapters
    disabled (``ActorWorker.reference_logprobs``), not a second copy in memory. Its ``placed`` is the actor's."""

    def logprobs(self, batch: PackedBatch) -> Pending[torch.Tensor]:
        return self._run(ActorWorker.reference_logprobs, batch)

    def close(self) -> None:
        """Nothing of its own to stop: the actor is released as itself."""


class RewardHandle(_Handle):
    """The reward model's members and its judge (``RewardWorker``)."""

    def score(self, prompts: list[str], completions: list[Completion]) -> Pending[torch.Tensor]:
        return self._run(RewardWorker.score, prompts, completions)

    def judge_scores(self, prompts: list[str], completions: list[Completion]) -> Pending[dict[str, torch.Tensor]]:
        return self._run(RewardWorker.judge_scores, prompts, completions)

    def weights(self) -> Pending[Weights]:
        return self._run(RewardWorker.weights)


class ActorEngine:
    """The rollout engine that lives in the actor's process (``engine_in_actor``): it samples from the actor's
    own weights, so it takes none after an update."""

    apart = False

    def __init__(self, actor: ActorHandle):
        self.actor = actor

    def sample(self, examples: list[Example]) -> Pending[list[Completion]]:
        return self.actor.sample(examples)

    def close(self) -> None:
        """Nothing of its own to stop: the actor is released as itself."""


@dataclass
class Roles:
    """An RL stage's placed roles: the actor and the rollout engines always, the others when the learner needs
    them (None otherwise)."""

    actor: ActorHandle
    rollout: ActorEngine | EngineGroup
    critic: CriticHandle | None = None
    reference: FrozenHandle | AdapterReference | None = None
    reward: RewardHandle | None = None
    teacher: FrozenHandle | None = None

    def close(self) -> None:
        """Stop the roles that run on Ray actors."""
        for field in fields(self):
            if (role := getattr(self, field.name)) is not None:
                role.close()
