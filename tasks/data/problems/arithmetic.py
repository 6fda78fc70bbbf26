"""Column arithmetic: fixed-width addition, subtraction, and multiplication by one digit.

The worked solution spells out each column from the right with its carry or
borrow, the way a person does it on paper, e.g. for ``347+485=``::

    <think>7+5+0=12,4+8+1=13,3+4+1=8</think><answer>832</answer>

Difficulty grows with ``digits`` (columns to chain without a slip) and with the
operation mix (borrows and multiplication carries are harder than addition).
"""

import random
import re

from tasks.data.problems.example import Example, format_solution, is_integer, tagged_score


def _addition(a: int, b: int) -> list[str]:
    steps, carry = [], 0
    for x, y in zip(reversed(str(a).zfill(len(str(b)))), reversed(str(b).zfill(len(str(a)))), strict=True):
        total = int(x) + int(y) + carry
        steps.append(f"{x}+{y}+{carry}={total}")
        carry = total // 10
    return steps


def _subtraction(a: int, b: int) -> list[str]:
    """Columns of a - b for a >= b; a borrowed column is written with its +10 folded in."""
    steps, borrow = [], 0
    for x, y in zip(reversed(str(a)), reversed(str(b).zfill(len(str(a)))), strict=True):
        top = int(x) + (10 if int(x) - int(y) - borrow < 0 else 0)
        steps.append(f"{top}-{y}-{borrow}={top - int(y) - borrow}")
        borrow = 1 if top > int(x) else 0
    return steps


def _multiplication(a: int, k: int) -> list[str]:
    steps, carry = [], 0
    for x in reversed(str(a)):
        total = int(x) * k + carry
        steps.append(f"{x}*{k}+{carry}={total}")
        carry = total // 10
    return steps


def generate(rng: random.Random, cfg) -> Example:
    """One problem with ``cfg.digits``-digit operands and an operation drawn from ``cfg.ops``."""
    op = rng.choice(cfg.ops)
    low, high = 10 ** (cfg.digits - 1), 10**cfg.digits - 1
    a, b = rng.randint(low, high), rng.randint(low, high)
    if op == "+":
        steps, result = _addition(a, b), a + b
    elif op == "-":
        a, b = max(a, b), min(a, b)
        steps, result = _subtraction(a, b), a - b
    else:
        b = rng.randint(2, 9)
        steps, result = _multiplication(a, b), a * b
    answer = str(result)
    return Example("arithmetic", f"{a}{op}{b}=", answer, format_solution(steps, answer))


_OPERATIONS = {"+": "addition", "-": "subtraction", "*": "multiplication"}


def difficulty(example: Example) -> str:
    """The operation: borrows and multiplication carries make some harder than others."""
    return _OPERATIONS[next(char for char in example.prompt[1:] if char in _OPERATIONS)]


def score(example: Example, response: str) -> tuple[bool, bool]:
    return tagged_score(example, response, is_correct)


def is_correct(example: Example, answer_text: str) -> bool:
    return is_integer(answer_text) and int(answer_text) == int(example.answer)


_PROMPT = re.compile(r"(\d+)([-+*])(\d+)=")


def mismatch(example: Example) -> str | None:
    """Why a row's prompt and answer disagree (a dataset of your own may carry a wrong answer), or None."""
    match = _PROMPT.fullmatch(example.prompt)
    if match is None:
        return f"'prompt' {example.prompt!r} is not of the form A+B=, A-B= or A*B="
    a, op, b = int(match[1]), match[2], int(match[3])
    expected = {"+": a + b, "-": a - b, "*": a * b}[op]
    if example.answer != str(expected):
        return f"'answer' {example.answer!r} is not what the prompt {example.prompt!r} gives ({expected})"
    return None
