"""Countdown: combine the given numbers with + - * / to reach a target.

Every number is used exactly once; many expressions are correct. The worked
solution combines the numbers left to right, e.g. for ``96 from 25,3,4,8:``::

    <think>25-3=22,22*4=88,88+8=96</think><answer>(25-3)*4+8</answer>

The verifier parses the answer with a small recursive-descent parser over exact
fractions: it never evaluates model text as code.
"""

import random
import re
from fractions import Fraction

from tasks.data.problems.example import Example, format_solution, tagged_score

_TOKEN = re.compile(r"\s*(\d+|[-+*/()])")
_MAX_ANSWER_CHARS = 200


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ; factor := INT | '(' expr ')'"""

    def __init__(self, text: str):
        self.tokens: list[str] = []
        position = 0
        while position < len(text.rstrip()):
            match = _TOKEN.match(text, position)
            if match is None:
                raise ValueError(f"unexpected character at {position}")
            self.tokens.append(match.group(1))
            position = match.end()
        self.position = 0
        self.numbers: list[int] = []

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise ValueError("unexpected end of expression")
        self.position += 1
        return token

    def parse(self) -> Fraction:
        value = self._expr()
        if self._peek() is not None:
            raise ValueError(f"unexpected {self._peek()!r}")
        return value

    def _expr(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-"):
            value = value + self._term() if self._take() == "+" else value - self._term()
        return value

    def _term(self) -> Fraction:
        value = self._factor()
        while self._peek() in ("*", "/"):
            if self._take() == "*":
                value *= self._factor()
            else:
                divisor = self._factor()
                if divisor == 0:
                    raise ValueError("division by zero")
                value /= divisor
        return value

    def _factor(self) -> Fraction:
        token = self._take()
        if token == "(":
            value = self._expr()
            if self._take() != ")":
                raise ValueError("missing ')'")
            return value
        if not token.isdigit():
            raise ValueError(f"unexpected {token!r}")
        self.numbers.append(int(token))
        return Fraction(int(token))


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Value of an arithmetic expression and the integer literals it uses; ValueError if malformed."""
    if len(expression) > _MAX_ANSWER_CHARS:
        raise ValueError("expression too long")
    parser = _Parser(expression)
    return parser.parse(), parser.numbers


def _combine(rng: random.Random, value: int, number: int, cfg) -> str:
    """An operation from ``cfg.ops`` that keeps every intermediate value a positive integer within bounds."""
    applies = {
        "+": True,
        "-": value > number,
        "*": value * number <= cfg.max_target,
        "/": number > 1 and value % number == 0,
    }
    return rng.choice([op for op in cfg.ops if applies[op]])


def generate(rng: random.Random, cfg) -> Example:
    """Draw ``cfg.count`` numbers in [1, ``cfg.max_number``] and a target reachable from them."""
    numbers = [rng.randint(1, cfg.max_number) for _ in range(cfg.count)]
    value, expression, last_op, steps = numbers[0], str(numbers[0]), None, []
    for number in numbers[1:]:
        op = _combine(rng, value, number, cfg)
        if op in "*/" and last_op in ("+", "-"):
            expression = f"({expression})"
        result = {"+": value + number, "-": value - number, "*": value * number, "/": value // number}[op]
        steps.append(f"{value}{op}{number}={result}")
        value, expression, last_op = result, f"{expression}{op}{number}", op
    shown = sorted(numbers)
    prompt = prompt_of(shown, value)
    return Example(
        "countdown", prompt, expression, format_solution(steps, expression), {"numbers": shown, "target": value}
    )


def difficulty(example: Example) -> str:
    return f"{len(example.meta['numbers'])} numbers"


def score(example: Example, response: str) -> tuple[bool, bool]:
    return tagged_score(example, response, is_correct)


def is_correct(example: Example, answer_text: str) -> bool:
    try:
        value, used = evaluate(answer_text)
    except ValueError:
        return False
    return value == example.meta["target"] and sorted(used) == sorted(example.meta["numbers"])


def prompt_of(numbers: list[int], target: int) -> str:
    return f"{target} from {','.join(map(str, sorted(numbers)))}:"


def mismatch(example: Example) -> str | None:
    """Why a row's prompt disagrees with its ``meta`` (the numbers and target the verifier checks), or None."""
    expected = prompt_of(example.meta["numbers"], example.meta["target"])
    if example.prompt != expected:
        return f"'prompt' {example.prompt!r} does not state meta's numbers and target ({expected!r})"
    return None
