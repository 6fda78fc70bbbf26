"""What a world answers a model turn with: a leaf of its own, so that a task family defining a world (TextArena's
games) needs none of the environment host that runs it."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """What an environment answers a model turn with: the observation the model reads next (None: nothing to say),
    the reward of the turn, and whether the episode is over."""

    observation: str | None
    reward: float = 0.0
    done: bool = False
