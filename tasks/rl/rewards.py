"""Reward functions for RL stages: rule-based verifiers, functions of your own, and their weighted sum.

A reward function scores a batch of responses, one float each::

    from tasks.rl.rewards import RewardInputs

    def my_reward(batch: RewardInputs) -> list[float]:
        return [float("42" in response) for response in batch.responses]

``batch.examples[i]`` is the problem response ``i`` answers (task, prompt, reference answer,
meta), ``batch.num_tokens[i]`` its length in tokens, ``batch.truncated[i]`` whether it was cut
off at ``batch.max_new_tokens`` without ending. Of a task with tools or an environment, response
``i`` is an episode's final model turn (what ``score`` grades), ``num_tokens[i]`` the tokens of
all its model turns and ``batch.env_rewards[i]`` the sum of its environment's rewards. Name a
function in an RL stage's ``rewards`` by its import path, ``my_module:my_reward`` (a module in
the project directory or an installed package), next to the built-ins:

- ``accuracy``: 1 if the task's verifier accepts the answer, else 0 (or the verifier's credit in [0, 1]: a
  reasoning-gym dataset's score);
- ``format``: 1 if the response is ``<think>…</think><answer>…</answer>``, else 0;
- ``tags``: the share of the format's four tags (``<think>``, ``</think>``, ``<answer>``, ``</answer>``) the
  response holds exactly once, a shaping reward for a model that rarely writes the whole format (R1-Zero from a
  small base model) where ``format`` pays nothing to learn from;
- ``digits``: for a task whose answers are integers, the share of the answer's places (aligned from the units)
  where the response's answer has the right digit: part credit for a model that is never right yet (R1-Zero on
  arithmetic from a small base model), 1 for the right answer;
- ``length``: 1 − tokens / max_new_tokens, a push towards shorter reasoning;
- ``overlong``: DAPO's soft overlong punishment, 0 down to −1 over the last ``overlong_buffer`` tokens;
- ``environment``: an episode's environment reward (0 for a single-turn response).

Functions that run code of a task or of yours (``accuracy``, ``format``, yours) run in a separate process with
a time budget per batch; the others (``length``, ``overlong``, ``environment``: arithmetic on what the rollout
already holds) run in the stage's own. A function that raises on a batch is retried response by response, and
a response whose scoring raises or returns something other than a finite number (a string such as "1.0"
included), a batch that runs out of time, or one whose process dies, scores 0 and is counted in the metrics
(``errors/<name>``, ``timeouts/<name>``, ``crashes/<name>``); when a function fails on more than
``reward_failure_warning`` of a batch, the stage's log (and the Prefect run) says so with the first error.
A bad reward function never stops training; a reward that is not finite, or beyond
±1e6 after weighting, does (``tasks/rl/trainer.py``).
"""

import importlib
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tasks.common.config.rl import REWARD_MODEL
from tasks.common.project_path import project_first_on_path
from tasks.common.registry_type import Registry
from tasks.common.sandbox import Sandbox, SandboxDied
from tasks.data.problems import Example, is_integer, parse_response, score_credit, score_response
from tasks.rl.core_algos import overlong_penalty


@dataclass(frozen=True)
class RewardInputs:
    """What a reward function sees: a batch of responses and the problems they answer."""

    examples: list[Example]
    responses: list[str]
    num_tokens: list[int]
    truncated: list[bool]
    max_new_tokens: int
    overlong_buffer: int = 0
    env_rewards: list[float] | None = None  # each episode's environment reward; None: single-turn responses

    def __len__(self) -> int:
        return len(self.responses)

    def row(self, index: int) -> "RewardInputs":
        return RewardInputs(
            [self.examples[index]],
            [self.responses[index]],
            [self.num_tokens[index]],
            [self.truncated[index]],
            self.max_new_tokens,
            self.overlong_buffer,
            None if self.env_rewards is None else [self.env_rewards[index]],
        )


RewardFunction = Callable[[RewardInputs], Sequence[float]]
# runs_task_code: whether it calls the task's verifier (code of the task's author): such a function runs in the
# reward process, under the time budget, as a function of yours does. grades_correctness: whether it pays what the
# verifier (or the environment) calls right, so the verifier is no held-out judge of a stage trained on it.
BUILT_IN: Registry[RewardFunction] = Registry("built-in reward", runs_task_code=True, grades_correctness=False)


def _env(batch: RewardInputs) -> list[float | None]:
    """Each response's episode reward (a task grading episodes scores with it); None for single completions."""
    return [None] * len(batch) if batch.env_rewards is None else batch.env_rewards


@BUILT_IN.register("accuracy", grades_correctness=True)
def accuracy(batch: RewardInputs) -> list[float]:
    return [score_credit(e, r, env)[1] for e, r, env in zip(batch.examples, batch.responses, _env(batch), strict=True)]


@BUILT_IN.register("correct", grades_correctness=True)
def correct(batch: RewardInputs) -> list[float]:
    """1 for a response the verifier calls correct (full credit), else 0: accuracy without a task's part credit,
    which can pay an answer for holding the right one (reasoning-gym's ``36`` for ``6`` earns 0.5)."""
    graded = zip(batch.examples, batch.responses, _env(batch), strict=True)
    return [float(score_response(e, r, env)[1]) for e, r, env in graded]


@BUILT_IN.register("format")
def format_reward(batch: RewardInputs) -> list[float]:
    graded = zip(batch.examples, batch.responses, _env(batch), strict=True)
    return [float(score_response(e, r, env)[0]) for e, r, env in graded]


FORMAT_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


@BUILT_IN.register("tags", runs_task_code=False)
def tags(batch: RewardInputs) -> list[float]:
    return [sum(response.count(tag) == 1 for tag in FORMAT_TAGS) / len(FORMAT_TAGS) for response in batch.responses]


@BUILT_IN.register("digits", grades_correctness=True)
def digits(batch: RewardInputs) -> list[float]:
    graded = zip(batch.examples, batch.responses, strict=True)
    return [digit_credit(example.answer, response) for example, response in graded]


def digit_credit(reference: str, response: str) -> float:
    """The share of places, aligned from the units, where a formatted response's integer answer has the reference's
    digit (or sign): 1 for the right answer, 2/3 for 139 against 129, 0 for 43 or 1290; 0 unformatted or not an
    integer. A ValueError for a reference that is not an integer: the reward does not apply to that task."""
    if not is_integer(reference):
        raise ValueError(f"digits: the reference answer {reference!r} is not an integer")
    parsed = parse_response(response)
    if parsed is None or not is_integer(parsed.answer):
        return 0.0
    width = max(len(reference), len(parsed.answer))
    places = zip(reference.rjust(width), parsed.answer.rjust(width), strict=True)
    return sum(ours == theirs for ours, theirs in places) / width


@BUILT_IN.register("length", runs_task_code=False)
def length(batch: RewardInputs) -> list[float]:
    return [1.0 - n / batch.max_new_tokens for n in batch.num_tokens]


@BUILT_IN.register("overlong", runs_task_code=False)
def overlong(batch: RewardInputs) -> list[float]:
    return overlong_penalty(
        torch.tensor(batch.num_tokens), torch.tensor(batch.truncated), batch.max_new_tokens, batch.overlong_buffer
    ).tolist()


@BUILT_IN.register("environment", runs_task_code=False, grades_correctness=True)
def environment(batch: RewardInputs) -> list[float]:
    return [0.0] * len(batch) if batch.env_rewards is None else list(batch.env_rewards)


def resolve(name: str) -> RewardFunction:
    """A built-in reward by name, or ``module:function`` imported; ValueError naming what is wrong."""
    if name in BUILT_IN:
        return BUILT_IN[name].function
    module_name, _, function_name = name.partition(":")
    if not function_name:
        raise ValueError(f"{name!r} is neither a built-in reward ({', '.join(BUILT_IN)}) nor module:function")
    try:
        with project_first_on_path():
            function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"reward {name!r} cannot be imported: {error}") from None
    if not callable(function):
        raise ValueError(f"reward {name!r} is not callable")
    return function


def _checked(values: Sequence[float], expected: int) -> list[float]:
    values = list(values)
    if len(values) != expected:
        raise ValueError(f"returned {len(values)} values for {expected} responses")
    # A number, not something float() happens to accept: "1.0" from a function is a bug to count, not a reward.
    if not all(isinstance(v, numbers.Real) for v in values):
        raise ValueError(f"returned a {type(next(v for v in values if not isinstance(v, numbers.Real))).__name__}")
    values = [float(v) for v in values]
    if not all(math.isfinite(v) for v in values):
        raise ValueError("returned a value that is not finite")
    return values


def _evaluate(function: RewardFunction, batch: RewardInputs) -> tuple[list[float], int, str | None]:
    """(one reward per response, how many responses failed to score, the first failure); a batch that fails is
    retried by row."""
    try:
        return _checked(function(batch), len(batch)), 0, None
    except Exception:
        pass
    rewards, errors, first = [], 0, None
    for index in range(len(batch)):
        try:
            rewards += _checked(function(batch.row(index)), 1)
        except Exception as error:
            rewards.append(0.0)
            errors += 1
            first = first or f"{type(error).__name__}: {error}"
    return rewards, errors, first


def _reward_handler(names: list[str]) -> Callable[[tuple[str, RewardInputs]], tuple[list[float], int, str | None]]:
    """The reward process's handler: the functions imported once, then (name, batch) scored as it comes."""
    functions = {name: resolve(name) for name in names}
    return lambda request: _evaluate(functions[request[0]], request[1])


def _in_process(name: str) -> bool:
    return name in BUILT_IN and not BUILT_IN[name].runs_task_code


class RewardScorer:
    """The weighted sum of named reward functions: those that run code of a task or of yours out of process under
    a time budget, the arithmetic ones here."""

    def __init__(self, weights: dict[str, float], timeout_seconds: float, warn_fraction: float = 0.5):
        self.weights = {name: weight for name, weight in weights.items() if name != REWARD_MODEL}
        for name in self.weights:
            resolve(name)  # a reward that cannot be imported is a configuration error, before any training
        self.timeout_seconds, self.warn_fraction = timeout_seconds, warn_fraction
        self._process = Sandbox(_reward_handler, ([name for name in self.weights if not _in_process(name)],))

    def score(self, batch: RewardInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, int]]:
        """(weighted total (N,), each function's rewards by name, failure counts by metric name)."""
        total, per_function, failures = torch.zeros(len(batch)), {}, {}
        for name, weight in self.weights.items():
            if _in_process(name):
                per_function[name] = torch.tensor(_checked(BUILT_IN[name](batch), len(batch)))
                total += weight * per_function[name]
                continue
            try:  # a function that hangs or crashes takes its process with it: the next call starts a fresh one
                answered, result = self._process.call((name, batch), self.timeout_seconds)
            except SandboxDied:
                answered, result = True, ([0.0] * len(batch), 0, "its process died")
                failures[f"crashes/{name}"] = len(batch)
            if not answered:
                rewards, failures[f"timeouts/{name}"] = [0.0] * len(batch), len(batch)
                first_error = f"over its {self.timeout_seconds:g} s budget"
            else:
                rewards, failures[f"errors/{name}"], first_error = result
            failed = sum(count for key, count in failures.items() if key.endswith(f"/{name}"))
            if failed > self.warn_fraction * len(batch):
                print(
                    f"WARNING reward {name!r} failed on {failed} of {len(batch)} responses ({first_error})", flush=True
                )
            per_function[name] = torch.tensor(rewards)
            total += weight * per_function[name]
        return total, per_function, failures

    def close(self) -> None:
        self._process.close()

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
