"""Reward functions for RL stages: rule-based verifiers, functions of your own, and their weighted sum.

A reward function scores a batch of responses, one float each::

    from tasks.rl.rewards import RewardInputs

    def my_reward(batch: RewardInputs) -> list[float]:
        return [float("42" in response) for response in batch.responses]

``batch.examples[i]`` is the problem response ``i`` answers (task, prompt, reference answer,
meta), ``batch.num_tokens[i]`` its length in tokens, ``batch.truncated[i]`` whether it was cut
off at ``batch.max_new_tokens`` without ending. Name a function in an RL stage's ``rewards``
by its import path, ``my_module:my_reward`` (a module in the project directory or an installed
package), next to the built-ins:

- ``accuracy``: 1 if the task's verifier accepts the answer, else 0;
- ``format``: 1 if the response is ``<think>…</think><answer>…</answer>``, else 0;
- ``length``: 1 − tokens / max_new_tokens, a push towards shorter reasoning;
- ``overlong``: DAPO's soft overlong punishment, 0 down to −1 over the last ``overlong_buffer`` tokens.

Functions run in a separate process with a time budget per batch: a function that raises on a
batch is retried response by response, and a response whose scoring raises or returns something
other than a finite number (a string such as "1.0" included), a batch that runs out of time, or
one whose process dies, scores 0 and is counted in the metrics (``errors/<name>``,
``timeouts/<name>``, ``crashes/<name>``); when a function fails on more than
``reward_failure_warning`` of a batch, the stage's log (and the Prefect run) says so with the
first error. A bad reward function never stops training; a reward that is not finite, or beyond
±1e6 after weighting, does (``tasks/rl/trainer.py``).
"""

import importlib
import math
import multiprocessing
import numbers
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from tasks.common.config.rl import REWARD_MODEL
from tasks.common.registry_type import Registry
from tasks.data.problems import Example, score_response
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
        )


RewardFunction = Callable[[RewardInputs], Sequence[float]]
BUILT_IN: Registry[RewardFunction] = Registry("built-in reward")


@BUILT_IN.register("accuracy")
def accuracy(batch: RewardInputs) -> list[float]:
    return [float(score_response(e, r)[1]) for e, r in zip(batch.examples, batch.responses, strict=True)]


@BUILT_IN.register("format")
def format_reward(batch: RewardInputs) -> list[float]:
    return [float(score_response(e, r)[0]) for e, r in zip(batch.examples, batch.responses, strict=True)]


@BUILT_IN.register("length")
def length(batch: RewardInputs) -> list[float]:
    return [1.0 - n / batch.max_new_tokens for n in batch.num_tokens]


@BUILT_IN.register("overlong")
def overlong(batch: RewardInputs) -> list[float]:
    return overlong_penalty(
        torch.tensor(batch.num_tokens), torch.tensor(batch.truncated), batch.max_new_tokens, batch.overlong_buffer
    ).tolist()


def resolve(name: str) -> RewardFunction:
    """A built-in reward by name, or ``module:function`` imported; ValueError naming what is wrong."""
    if name in BUILT_IN:
        return BUILT_IN[name].function
    module_name, _, function_name = name.partition(":")
    if not function_name:
        raise ValueError(f"{name!r} is neither a built-in reward ({', '.join(BUILT_IN)}) nor module:function")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # a module in the project directory, next to params.yaml
    try:
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


def _serve(names: list[str], connection: Connection) -> None:
    """The reward process: import the functions once, then score batches as they come."""
    functions = {name: resolve(name) for name in names}
    connection.send("ready")
    while True:
        try:
            name, batch = connection.recv()
        except EOFError:
            return
        connection.send(_evaluate(functions[name], batch))


class RewardProcessDied(RuntimeError):
    """The reward process exited while scoring a batch."""


class _RewardProcess:
    """A spawned process scoring batches; killed and replaced when a batch overruns its budget."""

    STARTUP_SECONDS = 120.0

    def __init__(self, names: list[str]):
        # spawn, not fork: the trainer holds torch threads that a forked child must not inherit
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(names, child), daemon=True)
        self.process.start()
        child.close()
        try:
            ready = self.connection.poll(self.STARTUP_SECONDS) and self.connection.recv() == "ready"
        except EOFError:  # it died importing the reward functions; its traceback is on stderr
            ready = False
        if not ready:
            self.kill()
            raise RuntimeError("the reward process did not start")

    def score(self, name: str, batch: RewardInputs, timeout: float) -> tuple[list[float], int, str | None] | None:
        """The function's rewards, error count and first error, or None if it ran out of time; RewardProcessDied
        if the process died (a crash of the function, say a segfault or os._exit, not a slow function)."""
        try:
            self.connection.send((name, batch))
            if self.connection.poll(timeout):
                return self.connection.recv()
        except (EOFError, OSError):
            raise RewardProcessDied(name) from None
        if not self.process.is_alive():
            raise RewardProcessDied(name)
        return None

    def kill(self) -> None:
        self.process.kill()
        self.process.join()


class RewardScorer:
    """The weighted sum of named reward functions, each evaluated out of process under a time budget."""

    def __init__(self, weights: dict[str, float], timeout_seconds: float, warn_fraction: float = 0.5):
        self.weights = {name: weight for name, weight in weights.items() if name != REWARD_MODEL}
        for name in self.weights:
            resolve(name)  # a reward that cannot be imported is a configuration error, before any training
        self.timeout_seconds, self.warn_fraction = timeout_seconds, warn_fraction
        self._process: _RewardProcess | None = None

    def score(self, batch: RewardInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, int]]:
        """(weighted total (N,), each function's rewards by name, failure counts by metric name)."""
        total, per_function, failures = torch.zeros(len(batch)), {}, {}
        for name, weight in self.weights.items():
            if self._process is None:
                self._process = _RewardProcess(list(self.weights))
            try:
                result = self._process.score(name, batch, self.timeout_seconds)
            except RewardProcessDied:
                self.close()  # the next batch gets a fresh process
                result, failures[f"crashes/{name}"] = ([0.0] * len(batch), 0, "its process died"), len(batch)
            if result is None:
                self.close()  # a stuck function dies with its process; the next batch gets a fresh one
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
        if self._process is not None:
            self._process.kill()
            self._process = None

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
