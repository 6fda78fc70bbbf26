"""The example schema shared by every problem family, and the response format."""

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

_RESPONSE = re.compile(r"<think>(.*?)</think><answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class Example:
    """One problem: what the model sees, what it should answer, and how.

    ``solution`` is a worked response in the ``<think>…</think><answer>…</answer>``
    format; ``meta`` carries what the verifier needs beyond the reference answer
    (for countdown: the numbers and the target).
    """

    task: str
    prompt: str
    answer: str
    solution: str
    meta: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


class ParsedResponse(NamedTuple):
    think: str
    answer: str


def format_solution(steps: list[str], answer: str) -> str:
    return f"<think>{','.join(steps)}</think><answer>{answer}</answer>"


def tagged_score(example: Example, response: str, is_correct: Callable[[Example, str], bool]) -> tuple[bool, bool]:
    """(well_formatted, correct) of a response in the ``<think>…</think><answer>…</answer>`` format, its answer
    judged by ``is_correct``: the built-in families' verifier."""
    parsed = parse_response(response)
    if parsed is None:
        return False, False
    return True, is_correct(example, parsed.answer)


def parse_response(text: str) -> ParsedResponse | None:
    """Split a response into its reasoning and answer; None unless the whole text is in format."""
    match = _RESPONSE.fullmatch(text.strip())
    return None if match is None else ParsedResponse(match.group(1), match.group(2).strip())
