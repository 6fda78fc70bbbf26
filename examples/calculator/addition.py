"""3-digit addition with the calculator tool (``agent_data.task: examples.calculator.addition``): what SmolLM2-135M-
Instruct gets right about once in a hundred in its head, and learns to hand to the tool (docs/agents.md). The tool,
the trace and the verifier are the calculator task's."""

import random
import re

from examples.calculator import TOOLS, score, worked_example
from tasks.data.problems.example import Example

__all__ = ["TOOLS", "difficulty", "generate", "mismatch", "score"]

_PROMPT = re.compile(r"What is (\d{3})\+(\d{3})\?")


def generate(rng: random.Random, cfg: object) -> Example:
    """One sum of two 3-digit numbers with its worked trace; ``cfg`` is unused."""
    return worked_example(__name__, f"{rng.randint(100, 999)}+{rng.randint(100, 999)}")


def difficulty(example: Example) -> str:
    return f"{len(example.answer)}-digit sum"


def mismatch(example: Example) -> str | None:
    """Why a row's prompt and answer disagree, or None."""
    match = _PROMPT.fullmatch(example.prompt)
    if match is None:
        return f"'prompt' {example.prompt!r} is not of the form 'What is A+B?' (A and B of 3 digits)"
    if example.answer != str(int(match[1]) + int(match[2])):
        return f"'answer' {example.answer!r} is not the sum the prompt asks for"
    return None
