"""Tasks: what a model is asked, how its response is verified, and how a task's rows are read.

A task is a module named in params (``task.name``): a built-in family (``arithmetic``, ``countdown``, seeded
synthetic problems) or a module of your own, by its import path from the project directory
(``examples.word_problems``; docs/tasks.md). Every stage that prompts or verifies goes through it. It defines:

- ``difficulty(example) -> str``: the label statistics are grouped by (required; a non-empty string, checked on
  every row read);
- ``score(example, response) -> (well_formatted, correct)``: the verifier of a model's response, required of
  ``task.name``'s module (eval and the RL rewards grade with it); the general rows R1's rejection sampling mixes in
  may come from a task without one, ranked by the reward model instead. Every stage calls it through
  ``score_response``, which refuses a verdict that is not two truth values, and a verifier that raises, naming the
  task, ``score()`` and the example;
- ``from_row(row: dict) -> Example``: one row of your JSONL, in your own fields, as the ``Example`` every stage
  reads; a ValueError saying what is wrong (or a KeyError, TypeError from a row of the wrong shape) names the
  row's ``file:line``. Without it, rows are ``Example`` rows (``task``, ``prompt``, ``answer``, ``solution``,
  ``meta``);
- ``mismatch(example) -> str | None``: why a row disagrees with itself (a prompt and an answer that do not match),
  checked on every row read;
- ``generate(rng, cfg) -> Example``: a seeded synthetic problem (``cfg``: the ``task.<name>`` section), for a task
  that generates its data; without it, ``data.train_file`` and ``data.test_file`` are required.

A row is the task's that read or generated it: its ``Example.task`` is ``task.name`` whichever module's ``from_row``
or ``generate`` built it (one re-exported from another task), so the declared task's verifier grades it.
"""

import functools
import importlib
import inspect
import numbers
from types import ModuleType

import numpy

from tasks.common.project_path import project_first_on_path
from tasks.data.problems import arithmetic, countdown, reasoning_gym_family, textarena_family
from tasks.data.problems.example import Example, is_integer, is_trace, parse_response, trace_turns

# Imported here, not by name: dvc.yaml's code deps are read from the imports, and a verifier is every stage's code.
BUILT_IN: dict[str, ModuleType] = {
    "arithmetic": arithmetic,
    "countdown": countdown,
    "reasoning_gym": reasoning_gym_family,
    "textarena": textarena_family,
}
REQUIRED = ("difficulty",)
ENV_REWARD_ARGUMENT = "env_reward"  # a score's parameter for the episode's environment reward (grades_episodes)

__all__ = [
    "BUILT_IN",
    "Example",
    "TaskError",
    "difficulty_label",
    "grades_episodes",
    "has_verifier",
    "is_integer",
    "is_trace",
    "parse_response",
    "score_credit",
    "score_response",
    "task_module",
    "trace_turns",
]
# How much of a response, a prompt or a returned value an error quotes: enough to find the example.
_QUOTED_CHARS = 60


class TaskError(ValueError):
    """A task module that cannot serve: it does not import, lacks a function a task defines, or one of its
    functions returns what a task's cannot (a verdict that is not two truth values, a label that is not a string)."""


@functools.cache
def task_module(name: str) -> ModuleType:
    """The task ``name`` names: a built-in family, or a module imported from the project directory; TaskError
    naming ``task.name`` when it does not import or lacks a required function."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    try:
        with project_first_on_path():
            module = importlib.import_module(name)
    except Exception as error:  # whatever its import raises is the user's module's problem, said in one line
        raise TaskError(
            f"task.name: the task module {name!r} does not import ({type(error).__name__}: {error})"
        ) from None
    missing = [function for function in REQUIRED if not callable(getattr(module, function, None))]
    if missing:
        raise TaskError(
            f"task.name: the task module {name!r} lacks {', '.join(missing)}() (docs/tasks.md lists what a task "
            "defines)"
        )
    return module


def task_of(examples: list[Example]) -> str:
    """The one task ``examples`` are problems of (a dataset's rows are its stage's task's: ``task.name``, or
    ``agent_data.task``); ValueError naming them when they mix tasks."""
    tasks = sorted({example.task for example in examples})
    if len(tasks) != 1:
        raise ValueError(f"expected the rows of one task, got {', '.join(tasks) or 'no rows'}")
    return tasks[0]


def has_verifier(example: Example) -> bool:
    return callable(getattr(task_module(example.task), "score", None))


def score_response(example: Example, response: str, env_reward: float | None = None) -> tuple[bool, bool]:
    """(well_formatted, correct) of a model's response to ``example``, by its task's verifier: the one call every
    stage grades through (``score_credit``); correct is full credit."""
    well_formatted, credit = score_credit(example, response, env_reward)
    return well_formatted, credit == 1.0


@functools.cache  # every score goes through it: a signature is read once a task
def grades_episodes(module: ModuleType) -> bool:
    """Whether the task's ``score`` grades a whole episode: it takes ``env_reward``, the sum of the world's rewards
    in the episode the response ended (a game is won by every move, not the last alone)."""
    score = getattr(module, "score", None)
    return callable(score) and ENV_REWARD_ARGUMENT in inspect.signature(score).parameters


def score_credit(example: Example, response: str, env_reward: float | None = None) -> tuple[bool, float]:
    """(well_formatted, credit) of a model's response to ``example``: its task's ``score``, whose second value is a
    truth value or a credit in [0, 1] (reasoning-gym's scores; the accuracy reward). ``env_reward``: the episode's,
    for a task whose score grades episodes (``grades_episodes``); TaskError when such a task's response comes
    without one. TaskError naming the task, ``score()`` and the example when the verifier raises or returns
    anything else: a NaN or a 2.0 would otherwise become a metric or a reward."""
    module = task_module(example.task)
    by_episode = grades_episodes(module)
    if by_episode and env_reward is None:
        raise TaskError(
            f"{example.task}.score() grades a whole episode (it takes {ENV_REWARD_ARGUMENT}), but this stage graded "
            f"a response alone: {_quoted(response)} to the prompt {_quoted(example.prompt)}"
        )
    try:
        verdict = (
            module.score(example, response, env_reward=env_reward) if by_episode else module.score(example, response)
        )
    except Exception as error:  # the verifier's own bug, or model text it cannot read: the task's to fix, said so
        raise TaskError(_blame(example, response, f"raised {type(error).__name__}: {error}")) from error
    pair = (
        (_truth(verdict[0]), _credit(verdict[1])) if isinstance(verdict, tuple | list) and len(verdict) == 2 else None
    )
    if pair is None or None in pair:
        pair_of = "not the pair (well_formatted, correct) of bools (or a credit in [0, 1] for correct)"
        what = f"returned {_quoted(verdict)}, {pair_of}"
        raise TaskError(_blame(example, response, what))
    return pair


def difficulty_label(example: Example) -> str:
    """The label ``example``'s task groups it under; TaskError naming the task and the example when ``difficulty()``
    returns anything but a non-empty string (a metric's name is made of it)."""
    label = task_module(example.task).difficulty(example)
    if not isinstance(label, str) or not label:
        raise TaskError(
            f"{example.task}.difficulty() returned {_quoted(label)}, not a non-empty string, for the prompt "
            f"{_quoted(example.prompt)}"
        )
    return label


def _truth(value: object) -> bool | None:
    """A verdict's truth value: a bool (numpy's too: ``numpy.isclose`` returns one) or a number that is 0 or 1."""
    if isinstance(value, bool | numpy.bool_) or (isinstance(value, numbers.Real) and value in (0, 1)):
        return bool(value)
    return None


def _credit(value: object) -> float | None:
    """A verdict's credit: a truth value as 0 or 1, or a finite number in [0, 1]."""
    if isinstance(value, bool | numpy.bool_):
        return float(value)
    if isinstance(value, numbers.Real) and 0.0 <= float(value) <= 1.0:  # NaN fails both comparisons
        return float(value)
    return None


def _blame(example: Example, response: str, what: str) -> str:
    return (
        f"{example.task}.score() {what}, on the response {_quoted(response)} to the prompt {_quoted(example.prompt)} "
        "(docs/tasks.md: a verifier returns (well_formatted, correct))"
    )


def _quoted(value: object) -> str:
    """``value``'s repr, cut short, and its type unless a string's quotes say it: True and 'True' differ."""
    text = repr(value)
    text = text if len(text) <= _QUOTED_CHARS else f"{text[:_QUOTED_CHARS]}…"
    return text if isinstance(value, str) else f"{text} ({type(value).__name__})"
