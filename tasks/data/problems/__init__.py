"""Seeded synthetic reasoning problems with programmatic verifiers.

Each problem family is a module exposing ``generate(rng, cfg) -> Example``,
``is_correct(example, answer_text) -> bool`` (its verifier), ``difficulty(example) -> str``
(a label statistics are grouped by) and ``mismatch(example) -> str | None`` (why a row's prompt
disagrees with its answer or meta, checked on every row read); ``PROBLEMS`` maps the family name used in params
(``task.name``) to that module.
"""

from types import ModuleType

from tasks.data.problems import arithmetic, countdown
from tasks.data.problems.example import Example, parse_response

PROBLEMS: dict[str, ModuleType] = {"arithmetic": arithmetic, "countdown": countdown}

__all__ = ["PROBLEMS", "Example", "parse_response", "score_response"]


def score_response(example: Example, response: str) -> tuple[bool, bool]:
    """Return (well_formatted, correct) for a model response to ``example``."""
    parsed = parse_response(response)
    if parsed is None:
        return False, False
    return True, PROBLEMS[example.task].is_correct(example, parsed.answer)
