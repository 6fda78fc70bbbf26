"""Problem datasets as JSONL: seeded generation with disjoint splits, and row-by-row validation.

A problem row is one ``Example``: ``{"task", "prompt", "answer", "solution", "meta"}``.
A preference row is one ``PreferencePair``: ``{"prompt", "chosen", "rejected", "meta"}``,
where meta may carry the gold judge's utilities ``gold_chosen`` / ``gold_rejected``.
Reading validates every row (its JSON, keys, types, and for problems the task, the
response format and that the worked solution passes the task's verifier) and names
``file:line`` of the first bad one, so a dataset of your own fails before any training starts.
"""

import json
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any, TypeVar

from tasks.common.errors import warn
from tasks.data.problems import (
    BUILT_IN,
    Example,
    TaskError,
    difficulty_label,
    grades_episodes,
    has_verifier,
    score_response,
    task_module,
    trace_turns,
)
from tasks.data.prompts import PromptFormat

_STRING_FIELDS = ("task", "prompt", "answer", "solution")
_PAIR_FIELDS = ("prompt", "chosen", "rejected")
_GOLD_KEYS = ("gold_chosen", "gold_rejected")
Row = TypeVar("Row")
_MAX_DRAWS_PER_EXAMPLE = 50
# A row's text past this is a broken file, not a long answer: it would cost gigabytes once tokenised and padded.
MAX_TEXT_CHARS = 16_384
# A whole line, checked before it is parsed: room for every field at its cap, JSON-escaped, and a meta.
MAX_LINE_BYTES = 2**20


class DatasetError(ValueError):
    """A malformed dataset; the message names the file and line."""


def generate_splits(
    task_cfg, num_train: int, num_test: int, seed: int, section: str = "data"
) -> tuple[list[Example], list[Example]]:
    """Draw ``num_test`` then ``num_train`` distinct problems; no prompt appears in both splits. ``section``: the
    params section whose sizes these are (data, agent_data), named when the task has too few problems."""
    family, family_cfg = task_module(task_cfg.name), getattr(task_cfg, task_cfg.name, None)
    rng = random.Random(f"alignflow-data-{seed}")
    seen: set[str] = set()
    splits = []
    for size in (num_test, num_train):
        split: list[Example] = []
        for _ in range(size * _MAX_DRAWS_PER_EXAMPLE):
            if len(split) == size:
                break
            # the declared task's, whichever module's generate() drew it: its verifier grades it (as in from_row)
            example = replace(family.generate(rng, family_cfg), task=task_cfg.name)
            if example.prompt not in seen:
                seen.add(example.prompt)
                split.append(example)
        if len(split) < size:
            raise DatasetError(
                f"task.{task_cfg.name}: found only {len(seen)} distinct problems, fewer than "
                f"{section}.num_train + {section}.num_test = {num_train + num_test}; make the task harder or the "
                "splits smaller"
            )
        splits.append(split)
    test, train = splits
    return train, test


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def gold_prefers_chosen(self) -> bool | None:
        """The noise-free judge's verdict on the label, when the row carries the judge's utilities."""
        if not all(key in self.meta for key in _GOLD_KEYS):
            return None
        return self.meta["gold_chosen"] > self.meta["gold_rejected"]

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


def write_jsonl(path: Path, rows: list[Example] | list[PreferencePair]) -> None:
    with open(path, "w") as handle:
        for row in rows:
            handle.write(json.dumps(row.to_row(), sort_keys=True) + "\n")


def read_examples(path: str | Path) -> list[Example]:
    """Every row of a problem JSONL as an Example; DatasetError naming ``path:line`` on the first bad row."""
    return _read_rows(path, _parse_row)


def shard_files(source: str | Path) -> list[Path]:
    """The JSONL files ``source`` names: itself, a directory's ``*.jsonl``, or a glob's matches, in name order
    (so rows concatenate in the same order wherever the shards arrived from)."""
    path = Path(source)
    if path.is_file():
        return [path]
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else sorted(Path().glob(str(source)))
    return [f for f in files if f.is_file()]


def is_shard_of(path: str | PurePath, source: str) -> bool:
    """Whether ``shard_files(source)`` reads ``path``, judged by the names alone (for a commit not checked out)."""
    path = PurePath(path)
    if any(char in source for char in "*?["):
        return path.match(source)
    return path == PurePath(source) or (path.parent == PurePath(source) and path.suffix == ".jsonl")


def read_shards(source: str | Path, task: str | None = None, say_repeats: bool = True) -> list[Example]:
    """Every row of every shard ``source`` names (see ``shard_files``), each validated, and each of the project's
    ``task`` family when one is given; DatasetError naming the shard's ``file:line`` on the first bad row, or the
    source when it names no file. Rows that repeat an earlier one are kept (a repeated row is how a dataset
    upweights it) but said, with their count and the first repeat's ``file:line``, unless ``say_repeats`` is false (a
    check before a run: the data stage says it once)."""
    return [example for _, example in read_located_shards(source, task, say_repeats)]


def read_located_shards(
    source: str | Path, task: str | None = None, say_repeats: bool = True
) -> list[tuple[str, Example]]:
    """``read_shards``' rows, each with its ``file:line``."""
    files = shard_files(source)
    if not files:
        raise DatasetError(f"{source}: no JSONL file (a file, a directory of *.jsonl shards, or a glob)")
    parse = _parse_row if task is None else _row_parser(task)
    rows, first_seen, repeats = [], {}, []
    for shard in files:
        for line, example in _numbered_rows(shard, parse):
            where = f"{shard}:{line}"
            if (seen := first_seen.setdefault(json.dumps(example.to_row(), sort_keys=True), where)) != where:
                repeats.append(f"{where} repeats {seen}")
            rows.append((where, example))
    if repeats and say_repeats:
        warn(f"{source}: {len(repeats)} row(s) repeat an earlier one and train as often as they appear ({repeats[0]})")
    return rows


def read_preferences(path: str | Path) -> list[PreferencePair]:
    """Every row of a preference JSONL as a PreferencePair; DatasetError naming ``path:line`` on the first bad row."""
    return _read_rows(path, _parse_pair)


def warn_unknown_characters(examples: list[Example], tokenizer: Any, source: str | Path) -> None:
    """Warn when the rows hold characters ``tokenizer`` reads as its unknown token (the built-in tiny model's
    character tokenizer knows only the built-in tasks' alphabet): all of them alike to the model."""
    if tokenizer.unk_token_id is None:  # a byte-level BPE reads every character
        return
    texts = [example.prompt + (example.solution or "") for example in examples]

    def unknown(char: str) -> bool:
        return tokenizer.unk_token_id in tokenizer(char, add_special_tokens=False)["input_ids"]

    lacking = {char for char in set().union(*map(set, texts)) if unknown(char)}
    if lacking:
        counts = Counter(char for text in texts for char in text if char in lacking)
        hit = sum(1 for text in texts if lacking & set(text))
        shown = ", ".join(repr(char) for char, _ in counts.most_common(5))
        warn(
            f"{source}: {hit} row(s) hold characters the model's tokenizer does not know ({shown}): each reads as "
            f"{tokenizer.unk_token}, so the model cannot tell them apart"
        )


def check_prompt_lengths(
    examples: list[Example],
    tokenizer: Any,
    prompt_format: PromptFormat,
    source: str | Path,
    max_prompt_length: int,
    positions: int,
    new_tokens: tuple[str, int],
) -> None:
    """Every prompt, as ``prompt_format`` gives it to the model, fits ``max_prompt_length`` (sft.max_prompt_length, the
    bound every stage shares) and leaves the model's ``positions`` room for the stage's ``new_tokens`` (key, value);
    DatasetError naming ``source:line``. And a warning when worked solutions, with their stop token, need more than
    ``new_tokens``: the stage would cut off responses as long as the task's own answers, so its scores would fall
    for want of room, not of skill."""
    warn_unknown_characters(examples, tokenizer, source)
    key, count = new_tokens
    limit, why = max_prompt_length, f"sft.max_prompt_length={max_prompt_length}"
    if positions - count < limit:
        limit, why = positions - count, f"the model's {positions} positions less {key}={count}"
    formats = [prompt_format.for_example(e) for e in examples]
    for line, (example, form) in enumerate(zip(examples, formats, strict=True), start=1):
        if token := prompt_format.control_token_in(tokenizer, example.prompt):
            raise DatasetError(f"{source}:{line}: the prompt holds {token!r}, a control token of the model's tokenizer")
        if example.solution and not example.solution.startswith(form.response_prefix):
            raise DatasetError(
                f"{source}:{line}: the worked solution does not start with task.response_prefix "
                f"{form.response_prefix!r}, which the prompt ends with: {example.solution[:60]!r}"
            )
    lengths = [len(ids) for ids in prompt_format.encode_examples(tokenizer, examples)]
    system = prompt_format.system_prompt
    for line, length in enumerate(lengths, start=1):
        if length > limit:
            own = len(tokenizer(system, add_special_tokens=False)["input_ids"]) if system else 0
            blame = f" (task.system_prompt is {own} tokens of it)" if system else ""
            raise DatasetError(f"{source}:{line}: the prompt is {length} tokens, over {why}{blame}")
    solved = [(e.solution, form) for e, form in zip(examples, formats, strict=True) if e.solution]
    solutions = [len(form.response_ids(tokenizer, solution)) for solution, form in solved]
    if over := sum(length > count for length in solutions):
        warn(
            f"{key}={count}: {over} of the {len(solutions)} worked solutions in {source} ({over / len(solutions):.0%}"
            f", the longest {max(solutions)} tokens with its stop token) do not fit; responses will be cut off"
        )


def _read_rows(path: str | Path, parse: Callable[[str], Row]) -> list[Row]:
    return [row for _, row in _numbered_rows(path, parse)]


def _numbered_rows(path: str | Path, parse: Callable[[str], Row]) -> list[tuple[int, Row]]:
    """(line number, row) for every non-blank line of ``path``; DatasetError naming ``path:line`` on a bad one."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such dataset file")
    rows = []
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                if len(raw) > MAX_LINE_BYTES:
                    raise ValueError(f"the row is {len(raw)} bytes, over the {MAX_LINE_BYTES} a row may hold")
                line = raw.decode("utf-8")
                if line.strip():
                    rows.append((line_number, parse(line)))
            except UnicodeDecodeError as error:
                raise DatasetError(f"{path}:{line_number}: not UTF-8 text (byte {error.start} of the line)") from None
            except ValueError as error:
                raise DatasetError(f"{path}:{line_number}: {error}") from None
    if not rows:
        raise DatasetError(f"{path}: no rows")
    return rows


def _check_lengths(row: dict[str, Any], fields: tuple[str, ...]) -> None:
    for key in fields:
        if len(row[key]) > MAX_TEXT_CHARS:
            raise ValueError(f"'{key}' is {len(row[key])} characters, over the {MAX_TEXT_CHARS} a row may hold")


def _json_dict(line: str) -> dict[str, Any]:
    """The line as a JSON object; ValueError saying why it is not one."""
    try:
        row: Any = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON ({error.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
    return row


def _json_object(line: str, string_fields: tuple[str, ...]) -> dict[str, Any]:
    """The row as a dict with every string field present and non-empty, and an object ``meta``."""
    row = _json_dict(line)
    unknown = set(row) - {*string_fields, "meta"}
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(sorted(unknown))}")
    for key in string_fields:
        if key not in row:
            raise ValueError(f"missing key '{key}'")
        if not isinstance(row[key], str) or not row[key].strip():
            raise ValueError(f"'{key}' must be a non-empty string")
    row.setdefault("meta", {})
    if not isinstance(row["meta"], dict):
        raise ValueError("'meta' must be a JSON object")
    return row


def _parse_pair(line: str) -> PreferencePair:
    row = _json_object(line, _PAIR_FIELDS)
    if row["chosen"] == row["rejected"]:
        raise ValueError("'chosen' and 'rejected' are the same response")
    _check_lengths(row, _PAIR_FIELDS)
    for key in _GOLD_KEYS:
        value = row["meta"].get(key)
        if key in row["meta"] and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"'meta.{key}' must be a number")
        if key in row["meta"] and not math.isfinite(value):
            raise ValueError(f"'meta.{key}' must be a finite number, got {value}")
    return PreferencePair(**row)


def _row_parser(task: str) -> Callable[[str], Example]:
    """How a row of your own for ``task`` is read: by the task's ``from_row`` (your own fields), or as an Example
    row; either way checked as every Example row is."""
    module = task_module(task)
    if not callable(getattr(module, "from_row", None)):

        def parse_example_row(line: str) -> Example:
            row = _json_object(line, _STRING_FIELDS)
            row_task = row["task"]
            # a row's own task is imported only when it is built in or the project's: a dataset imports no module
            if row_task not in (task, *BUILT_IN):
                raise ValueError(f"unknown task {row_task!r} (this project's is {task!r}, task.name)")
            example = _example_row(row)
            if row_task != task:
                raise ValueError(
                    f"a {row_task!r} row in a {task!r} project (task.name); the held-out split and the verifiers are "
                    "the project's task's"
                )
            return example

        return parse_example_row

    def parse(line: str) -> Example:
        try:
            example = module.from_row(_json_dict(line))
        except (LookupError, TypeError, AttributeError) as error:  # what reading a row of the wrong shape raises
            raise ValueError(f"{task}.from_row() raised {type(error).__name__}: {error}") from None
        if not isinstance(example, Example):
            raise TaskError(f"task.name: {task!r}'s from_row returned a {type(example).__name__}, not an Example")
        # The row is the declared task's whichever module's from_row built it (one re-exported from another task
        # tags its rows with that task's name): task.name's verifier grades it, and its statistics are task.name's.
        example = replace(example, task=task)
        _check_lengths(example.to_row(), _STRING_FIELDS)
        return _verified(example)

    return parse


def _parse_row(line: str) -> Example:
    """An Example row (what the data stage writes), its task's checks passed."""
    return _example_row(_json_object(line, _STRING_FIELDS))


def _example_row(row: dict[str, Any]) -> Example:
    """``_parse_row`` of a row already read as a JSON object of the Example fields."""
    _check_lengths(row, _STRING_FIELDS)
    try:
        task_module(row["task"])
    except TaskError:
        raise ValueError(f"unknown task {row['task']!r} (a built-in one, {', '.join(BUILT_IN)}, or a module)") from None
    return _verified(Example(row["task"], row["prompt"], row["answer"], row["solution"], row["meta"]))


def _verified(example: Example) -> Example:
    """``example`` once its task finds nothing wrong with it: its prompt agrees with its answer, it has a difficulty
    label, and its worked solution (when it has one) passes the verifier (when the task has one)."""
    mismatch = getattr(task_module(example.task), "mismatch", None)
    try:  # the prompt first: a row that disagrees with itself says so before its solution is judged
        problem = mismatch(example) if callable(mismatch) else None
        if problem is not None:
            raise ValueError(problem)
        difficulty_label(example)
    except (KeyError, TypeError) as error:
        raise ValueError(f"'meta' lacks what the {example.task} verifier needs ({error})") from None
    trace_turns(example)  # an agent task's worked trace: well formed, ending on the solution
    # a task grading whole episodes judges a trace's solution when the data stage replays the trace
    judged_alone = has_verifier(example) and example.solution and not grades_episodes(task_module(example.task))
    formatted, verified = score_response(example, example.solution) if judged_alone else (1, 1)
    if not formatted:
        raise ValueError("'solution' is not of the form the task's verifier reads (<think>…</think><answer>…</answer>)")
    if not verified:
        raise ValueError("'solution' does not pass the task's verifier")
    return example
