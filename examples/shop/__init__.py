"""A tool task with hidden data per row and no environment of its own (``agent_data.task: examples.shop``).

Each row is a shopping question, "How much do 3 pens cost?", whose unit price is hidden in the row's
``meta["prices"]``: the model cannot know it, and must call ``price(item)`` (a tool that takes the ``example`` and
reads it there), then ``calculate`` the total. The worked trace::

    assistant: <tool_call>{"name": "price", "arguments": {"item": "pen"}}</tool_call>
    tool:      7
    assistant: <tool_call>{"name": "calculate", "arguments": {"expression": "3*7"}}</tool_call>
    tool:      21
    assistant: <think>3*7=21</think><answer>21</answer>
"""

import random

from examples.calculator import TOOLS as CALCULATOR
from examples.calculator import calculate, tool_call
from tasks.data.environments import Tool
from tasks.data.problems.example import Example, tagged_score

ITEMS = ("pen", "cup", "hat", "map", "bag", "key")
_GAMES = 100_000  # a question's number keeps prompts distinct; it says nothing of the price


def price(item: str, example: Example) -> str:
    """The row's hidden unit price of ``item``; the model names the item, the host hands the tool its example."""
    prices = example.meta["prices"]
    return str(prices[item]) if item in prices else f"error: no {item!r} in this shop; it sells {', '.join(prices)}"


TOOLS = [
    Tool(
        "price",
        "The unit price of an item in this shop.",
        {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
        price,
    ),
    *CALCULATOR,
]


def generate(rng: random.Random, cfg: object) -> Example:
    """A question about one item of a shop whose prices are drawn per row, with its worked trace."""
    number, item, count = rng.randrange(_GAMES), rng.choice(ITEMS), rng.randint(2, 9)
    prices = {name: rng.randint(2, 20) for name in ITEMS}
    expression = f"{count}*{prices[item]}"
    total = calculate(expression)
    solution = f"<think>{expression}={total}</think><answer>{total}</answer>"
    turns = [
        {"role": "assistant", "content": tool_call("price", {"item": item})},
        {"role": "tool", "content": str(prices[item])},
        {"role": "assistant", "content": tool_call("calculate", {"expression": expression})},
        {"role": "tool", "content": total},
        {"role": "assistant", "content": solution},
    ]
    prompt = f"Order {number:05d}: how much do {count} {item}s cost?"
    return Example(__name__, prompt, total, solution, {"prices": prices, "item": item, "count": count, "turns": turns})


def score(example: Example, response: str) -> tuple[bool, bool]:
    """(the final turn is ``<think>...</think><answer>N</answer>``, N is the total)."""
    return tagged_score(example, response, lambda e, answer: answer == e.answer)


def difficulty(example: Example) -> str:
    return example.meta["item"]
