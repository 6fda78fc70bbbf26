"""Problem datasets as JSONL: seeded generation with disjoint splits, and row-by-row validation.

A row is one ``Example``: ``{"task", "prompt", "answer", "solution", "meta"}``.
Reading validates every row (its JSON, keys, types, task, response format, and
that the worked solution passes the task's verifier) and names ``file:line`` of
the first bad one, so a dataset of your own fails before any training starts.
"""

import json
import random
from pathlib import Path
from typing import Any

from tasks.problems import PROBLEMS, Example, parse_response

_STRING_FIELDS = ("task", "prompt", "answer", "solution")
_MAX_DRAWS_PER_EXAMPLE = 50


class DatasetError(ValueError):
    """A malformed dataset; the message names the file and line."""


def generate_splits(task_cfg, num_train: int, num_test: int, seed: int) -> tuple[list[Example], list[Example]]:
    """Draw ``num_test`` then ``num_train`` distinct problems; no prompt appears in both splits."""
    family, family_cfg = PROBLEMS[task_cfg.name], getattr(task_cfg, task_cfg.name)
    rng = random.Random(f"alignflow-data-{seed}")
    seen: set[str] = set()
    splits = []
    for size in (num_test, num_train):
        split: list[Example] = []
        for _ in range(size * _MAX_DRAWS_PER_EXAMPLE):
            if len(split) == size:
                break
            example = family.generate(rng, family_cfg)
            if example.prompt not in seen:
                seen.add(example.prompt)
                split.append(example)
        if len(split) < size:
            raise DatasetError(
                f"task.{task_cfg.name}: found only {len(seen)} distinct problems, fewer than "
                f"data.num_train + data.num_test = {num_train + num_test}; make the task harder or the splits smaller"
            )
        splits.append(split)
    test, train = splits
    return train, test


def write_jsonl(path: Path, examples: list[Example]) -> None:
    with open(path, "w") as handle:
        for example in examples:
            handle.write(json.dumps(example.to_row(), sort_keys=True) + "\n")


def read_examples(path: str | Path) -> list[Example]:
    """Every row of a JSONL dataset as an Example; DatasetError naming ``path:line`` on the first bad row."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such dataset file")
    examples = []
    with open(path) as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                examples.append(_parse_row(line))
            except ValueError as error:
                raise DatasetError(f"{path}:{line_number}: {error}") from None
    if not examples:
        raise DatasetError(f"{path}: no rows")
    return examples


def _parse_row(line: str) -> Example:
    try:
        row: Any = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON ({error.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
    unknown = set(row) - {*_STRING_FIELDS, "meta"}
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(sorted(unknown))}")
    for key in _STRING_FIELDS:
        if key not in row:
            raise ValueError(f"missing key '{key}'")
        if not isinstance(row[key], str) or not row[key].strip():
            raise ValueError(f"'{key}' must be a non-empty string")
    if row["task"] not in PROBLEMS:
        raise ValueError(f"unknown task {row['task']!r} (known: {', '.join(PROBLEMS)})")
    meta = row.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueError("'meta' must be a JSON object")
    example = Example(row["task"], row["prompt"], row["answer"], row["solution"], meta)
    parsed = parse_response(example.solution)
    if parsed is None:
        raise ValueError("'solution' is not of the form <think>…</think><answer>…</answer>")
    try:
        verified = PROBLEMS[example.task].is_correct(example, parsed.answer)
    except (KeyError, TypeError) as error:
        raise ValueError(f"'meta' lacks what the {example.task} verifier needs ({error})") from None
    if not verified:
        raise ValueError("'solution' does not pass the task's verifier")
    return example
