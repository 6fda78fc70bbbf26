"""Asynchronous rollouts (``max_staleness`` > 0): the rollout engine actors sample the prompts of the next
iterations while the actor trains on the current one.

At iteration t, once its own rollout is taken, the prompts of iterations t+1 .. t+max_staleness not yet handed out
go to the engines, before the update; the engines take the actor's weights after the update. A Ray actor runs its
calls in the order they were made, so the rollout trained at iteration t was sampled by the policy of iteration
t - max_staleness (the starting one before that), whatever the timing: staleness is a bound met exactly, not a
race, and a run is as deterministic as a synchronous one. The responses keep the engines' log-probs (μ); π_old is
the actor's, and the rollout correction (``tasks/rl/rollout_correction.py``) weighs the gap. A checkpoint waits for
the rollouts in flight and keeps them, so a resumed run trains on the very samples it would have.

With ``max_staleness`` 0 nothing is handed out ahead: each iteration draws, samples and trains in turn.
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tasks.common.config import RLConfig
from tasks.common.training import epoch_batch
from tasks.data.problems import Example
from tasks.rl.learner import LoopState
from tasks.rl.role_handles import Pending, Roles
from tasks.rollout.engine import Completion


@dataclass(frozen=True)
class Sampled:
    """A batch of prompts handed to the rollout engines, and their completions, pending or at hand."""

    examples: list[Example]
    pending: Any  # a Result: ``.result()`` waits for the completions
    handed_out: int  # the iteration during which the engines were given them (they held its starting weights)

    def result(self) -> list[Completion]:
        return self.pending.result()


def draw(examples: list[Example], cfg: RLConfig, state: LoopState, seed: int) -> list[Example]:
    """The next batch of ``rollout_batch_size`` prompts, advancing the loop's cursor."""
    batch = [examples[i] for i in epoch_batch(len(examples), cfg.rollout_batch_size, state.cursor, seed)]
    state.cursor += 1
    return batch


def sample(roles: Roles, examples: list[Example], step: int) -> Sampled:
    """Hand ``examples`` to the rollout role during iteration ``step``: ``group_size`` responses of each (episodes,
    for a task with tools or an environment). An engine apart returns at once; one in the actor's process samples
    before returning."""
    return Sampled(examples, roles.rollout.sample(examples), step)


class RolloutsAhead:
    """The rollouts handed to the engines ahead of their iterations, oldest first."""

    def __init__(
        self,
        roles: Roles,
        examples: list[Example],
        cfg: RLConfig,
        seed: int,
        samples_at: Callable[[int], bool] = lambda step: True,
    ):
        """``samples_at(i)``: whether iteration i samples from the policy (a learner may take some iterations'
        responses from a dataset instead)."""
        self.roles, self.examples, self.cfg, self.seed, self.samples_at = roles, examples, cfg, seed, samples_at
        self.in_flight: deque[tuple[int, Sampled]] = deque()  # (iteration, its rollout)

    def take(self, step: int) -> Sampled | None:
        """Iteration ``step``'s rollout, if it was handed out ahead."""
        if self.in_flight and self.in_flight[0][0] == step:
            return self.in_flight.popleft()[1]
        return None

    def hand_out(self, step: int, state: LoopState) -> None:
        """Hand the engines the prompts of the iterations after ``step``, up to ``max_staleness`` ahead (and the
        last), that sample and are not out yet."""
        after = self.in_flight[-1][0] if self.in_flight else step
        last = min(step + self.cfg.max_staleness, self.cfg.steps - 1)
        for ahead in range(after + 1, last + 1):
            if self.samples_at(ahead):
                batch = draw(self.examples, self.cfg, state, self.seed)
                self.in_flight.append((ahead, sample(self.roles, batch, step)))

    def state(self) -> list[tuple[int, Sampled]]:
        """The rollouts in flight, waited for: what a checkpoint keeps."""
        waited = [(step, sampled, Pending(sampled.result(), remote=False)) for step, sampled in self.in_flight]
        return [(step, replace(sampled, pending=done)) for step, sampled, done in waited]

    def load_state(self, saved: list[tuple[int, Sampled]]) -> None:
        self.in_flight = deque(saved)
