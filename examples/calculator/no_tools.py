"""The calculator task without its tool (``agent_data.task: examples.calculator.no_tools``): the same problems from
the same seed, each worked trace the answer alone, so a model must multiply in its head. The agent pipeline run on
it with the same budget is the baseline that shows what the tool adds (docs/agents.md)."""

import random

from examples.calculator import difficulty, mismatch, score
from examples.calculator import generate as generate_with_tool
from tasks.data.problems.example import Example

__all__ = ["difficulty", "generate", "mismatch", "score"]


def generate(rng: random.Random, cfg: object) -> Example:
    """The calculator task's problem for the same draws, its solution the final answer with no tool turns."""
    example = generate_with_tool(rng, cfg)
    return Example(__name__, example.prompt, example.answer, example.solution, {})
