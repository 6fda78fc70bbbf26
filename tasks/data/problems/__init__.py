"""Tasks: what a model is asked, how its response is verified, and how a task's rows are read.

A task is a module named in params (``task.name``): a built-in family (``arithmetic``, ``countdown``, seeded
synthetic problems) or a module of your own, by its import path from the project directory
(``examples.word_problems``; docs/tasks.md). Every stage that prompts or verifies goes through it. It defines:

- ``difficulty(example) -> str``: the label statistics are grouped by (required);
- ``score(example, response) -> (well_formatted, correct)``: the verifier of a model's response, required of
  ``task.name``'s module (eval and the RL rewards grade with it); the general rows R1's rejection sampling mixes in
  may come from a task without one, ranked by the reward model instead;
- ``from_row(row: dict) -> Example``: one row of your JSONL, in your own fields, as the ``Example`` every stage
  reads; a ValueError saying what is wrong names the row's ``file:line``. Without it, rows are ``Example`` rows
  (``task``, ``prompt``, ``answer``, ``solution``, ``meta``);
- ``mismatch(example) -> str | None``: why a row disagrees with itself (a prompt and an answer that do not match),
  checked on every row read;
- ``generate(rng, cfg) -> Example``: a seeded synthetic problem (``cfg``: the ``task.<name>`` section), for a task
  that generates its data; without it, ``data.train_file`` and ``data.test_file`` are required.
"""

import functools
import importlib
import os
import sys
from types import ModuleType

from tasks.data.problems import arithmetic, countdown
from tasks.data.problems.example import Example, parse_response

# Imported here, not by name: dvc.yaml's code deps are read from the imports, and a verifier is every stage's code.
BUILT_IN: dict[str, ModuleType] = {"arithmetic": arithmetic, "countdown": countdown}
REQUIRED = ("difficulty",)

__all__ = ["BUILT_IN", "Example", "TaskError", "has_verifier", "parse_response", "score_response", "task_module"]


class TaskError(ValueError):
    """A task module that cannot serve: it does not import, or lacks a function a task defines."""


@functools.cache
def task_module(name: str) -> ModuleType:
    """The task ``name`` names: a built-in family, or a module imported from the project directory; TaskError
    naming ``task.name`` when it does not import or lacks a required function."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # a module of your own, next to params.yaml
    try:
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


def has_verifier(example: Example) -> bool:
    return callable(getattr(task_module(example.task), "score", None))


def score_response(example: Example, response: str) -> tuple[bool, bool]:
    """(well_formatted, correct) of a model's response to ``example``, by its task's verifier."""
    return task_module(example.task).score(example, response)
