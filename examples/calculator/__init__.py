"""A tool-using task: 3-digit by 2-digit multiplication with a calculator (``task.name: examples.calculator``).

A product such as 347*86 is beyond what a small model can do in its head; a ``calculate`` tool does it. The worked
trace a row carries in ``meta["turns"]`` (after the prompt, the first user turn) is::

    assistant: <tool_call>{"name": "calculate", "arguments": {"expression": "347*86"}}</tool_call>
    tool:      29842
    assistant: <think>347*86=29842</think><answer>29842</answer>

and ``solution`` is its final assistant turn, in the project's response format, so the built-in checks, the
``format_rate`` metric and the ``format`` reward read it as they read every task's. README.md beside this file says
more.
"""

import json
import random
import re

from tasks.data.environments import Tool
from tasks.data.problems.example import Example, tagged_score

# An expression longer than this is not a question about this task: the bound also caps the size of the integers a
# product can reach (its digits are at most the expression's) and the parser's recursion depth.
MAX_EXPRESSION_CHARS = 100
_TOKEN = re.compile(r"\s*(\d+|[-+*()])")
_INTEGER = re.compile(r"-?\d+")
_PROMPT = re.compile(r"What is (\d{3})\*(\d{2})\?")


class _Refused(ValueError):
    """An expression the calculator does not evaluate; its message is the tool's reply."""


class _Parser:
    """expr := term (('+'|'-') term)* ; term := unary ('*' unary)* ; unary := '-' unary | atom ;
    atom := INTEGER | '(' expr ')'. It reads integer arithmetic and nothing else: no names, calls or other operators,
    so no text a model writes is ever run as code."""

    def __init__(self, text: str):
        self.tokens: list[str] = []
        position, end = 0, len(text.rstrip())
        while position < end:
            match = _TOKEN.match(text, position)
            if match is None:
                raise _Refused("error: only integers, +, -, * and parentheses are allowed")
            self.tokens.append(match.group(1))
            position = match.end()
        self.position = 0

    def parse(self) -> int:
        if not self.tokens:
            raise _Refused("error: empty expression")
        value = self._expr()
        if self._peek() is not None:
            raise _Refused(f"error: unexpected {self._peek()}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise _Refused("error: unexpected end of expression")
        self.position += 1
        return token

    def _expr(self) -> int:
        value = self._term()
        while self._peek() in ("+", "-"):
            value = value + self._term() if self._take() == "+" else value - self._term()
        return value

    def _term(self) -> int:
        value = self._unary()
        while self._peek() == "*":
            self._take()
            value *= self._unary()
        return value

    def _unary(self) -> int:
        if self._peek() == "-":
            self._take()
            return -self._unary()
        return self._atom()

    def _atom(self) -> int:
        token = self._take()
        if token == "(":
            value = self._expr()
            if self._take() != ")":
                raise _Refused("error: missing )")
            return value
        if not token.isdigit():
            raise _Refused(f"error: expected a number, got {token}")
        return int(token)


def calculate(expression: str) -> str:
    """The value of an integer expression of + - * and parentheses, as text; "error: ..." for anything else."""
    if not isinstance(expression, str):  # a model's call may pass any JSON value, a bare number included
        return "error: expression must be a string"
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: expression over {MAX_EXPRESSION_CHARS} characters"
    try:
        return str(_Parser(expression).parse())
    except _Refused as refusal:
        return str(refusal)


TOOLS = [
    Tool(
        name="calculate",
        description="Evaluate integer arithmetic with +, -, * and parentheses, e.g. 347*86.",
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "the expression, e.g. 347*86"}},
            "required": ["expression"],
        },
        function=calculate,
    )
]


def tool_call(name: str, arguments: dict) -> str:
    """A call in the Hermes format the default tool environment parses."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def worked_example(task: str, expression: str) -> Example:
    """The question "What is ``expression``?" of ``task`` with its worked trace: the call, the result, the answer."""
    value = calculate(expression)
    solution = f"<think>{expression}={value}</think><answer>{value}</answer>"
    turns = [
        {"role": "assistant", "content": tool_call("calculate", {"expression": expression})},
        {"role": "tool", "content": value},
        {"role": "assistant", "content": solution},
    ]
    return Example(task, f"What is {expression}?", value, solution, {"turns": turns})


def generate(rng: random.Random, cfg: object) -> Example:
    """One product of a 3-digit and a 2-digit number with its worked trace; ``cfg`` is unused (a task module of your
    own has no ``task.<name>`` section of settings)."""
    return worked_example(__name__, f"{rng.randint(100, 999)}*{rng.randint(10, 99)}")


def score(example: Example, response: str) -> tuple[bool, bool]:
    """(the final turn is ``<think>...</think><answer>N</answer>``, N is the answer); a final turn that is still a
    tool call is not an answer."""
    return tagged_score(example, response, _is_answer)


def _is_answer(example: Example, answer: str) -> bool:
    return _INTEGER.fullmatch(answer) is not None and int(answer) == int(example.answer)


def difficulty(example: Example) -> str:
    return f"{len(example.answer)}-digit product"


def mismatch(example: Example) -> str | None:
    """Why a row's prompt and answer disagree, or None."""
    match = _PROMPT.fullmatch(example.prompt)
    if match is None:
        return f"'prompt' {example.prompt!r} is not of the form 'What is A*B?' (A of 3 digits, B of 2)"
    if example.answer != str(int(match[1]) * int(match[2])):
        return f"'answer' {example.answer!r} is not the product the prompt asks for"
    return None
