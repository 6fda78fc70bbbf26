"""An example task of your own: short word problems with numeric answers (``task.name: examples.word_problems``).

A row of its JSONL (``train.jsonl``, ``test.jsonl`` beside this file; ``make_data.py`` wrote them) holds its own
fields: ``{"question": "...", "answer": 19, "steps": "12+7=19", "operation": "addition"}``. The verifier reads
the last number of a response, so a model answers in its own words ("... The answer is 19."), as an instruct
model does through its chat template. docs/tasks.md walks through writing one like it.
"""

import math
import re

from tasks.data.problems import Example

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
OPERATIONS = ("addition", "subtraction", "multiplication", "division")


def from_row(row: dict) -> Example:
    """A row as the Example every stage reads; ValueError naming the field that is wrong."""
    unknown = set(row) - {"question", "answer", "steps", "operation"}
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))}")
    question, answer = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("'question' must be a non-empty string")
    if isinstance(answer, bool) or not isinstance(answer, int | float) or not math.isfinite(answer):
        raise ValueError(f"'answer' must be a number, got {answer!r}")
    if row.get("operation", "addition") not in OPERATIONS:
        raise ValueError(f"'operation' must be one of {', '.join(OPERATIONS)}, got {row['operation']!r}")
    steps = row.get("steps", "")
    solution = f"{steps}. The answer is {_number(answer)}." if steps else f"The answer is {_number(answer)}."
    meta = {"operation": row.get("operation", "addition")}
    return Example(__name__, question.strip(), _number(answer), solution, meta)


def score(example: Example, response: str) -> tuple[bool, bool]:
    """(the response states a number, its last number is the answer)."""
    numbers = NUMBER.findall(response)
    if not numbers:
        return False, False
    return True, math.isclose(float(numbers[-1]), float(example.answer), abs_tol=1e-9)


def difficulty(example: Example) -> str:
    return example.meta["operation"]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
