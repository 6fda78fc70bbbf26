"""The example schema shared by every problem family, and the response format."""

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

_RESPONSE = re.compile(r"<think>(.*?)</think><answer>(.*?)</answer>", re.DOTALL)
_INTEGER = re.compile(r"-?\d+")


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


TRACE_ROLES = ("assistant", "tool", "user")  # the model's turns, and what a tool or the world answered


def is_integer(text: str) -> bool:
    """Whether ``text`` is an integer as a model writes one: digits, a minus sign in front or none."""
    return _INTEGER.fullmatch(text) is not None


def is_trace(example: Example) -> bool:
    """Whether ``example``'s worked response is an agent task's trace of several turns (``trace_turns``)."""
    return example.meta.get("turns") is not None


def trace_turns(example: Example) -> list[tuple[str, str]]:
    """The worked response as (role, text) turns after the prompt: an agent task's trace (``meta["turns"]``: the
    model's turns, tool calls included, and the tool's or the world's replies, ending on the model's final turn,
    which is ``solution``), or the one-turn case, ``solution`` alone. ValueError saying what is wrong with a trace."""
    turns = example.meta.get("turns")
    if turns is None:
        return [("assistant", example.solution)]
    if not isinstance(turns, list) or not turns:
        raise ValueError("meta 'turns' must be a non-empty list of {'role', 'content'} turns")
    pairs = []
    for index, turn in enumerate(turns):
        if not (isinstance(turn, dict) and turn.get("role") in TRACE_ROLES and isinstance(turn.get("content"), str)):
            raise ValueError(
                f"meta 'turns'[{index}] must be {{'role': one of {', '.join(TRACE_ROLES)}, 'content': text}}"
            )
        pairs.append((turn["role"], turn["content"]))
    if pairs[-1] != ("assistant", example.solution):
        raise ValueError("meta 'turns' must end on the model's final turn, the row's 'solution'")
    return pairs


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
