"""Overrides made to stick: every command that takes ``key=value`` overrides (``alignflow stage``, ``repro``, ``run``)
validates them with the file, then writes them into the params file before any stage runs, so that what a stage
writes and what ``dvc.lock`` records always agree with params.yaml.

The file is edited as YAML, round trip (ruamel.yaml, DVC's own YAML library): comments, order, quoting and every
``null`` stay as they were, and only the overridden values change. A value is what omegaconf reads from the override
(the same reading ``load_params`` validated), so ``grpo.rewards={mine:fn: 1.0}`` writes the mapping it means.
"""

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import SingleQuotedScalarString

from tasks.common.artifacts import atomic_output
from tasks.params.load import REPLACED_BY_THE_FILE


def _round_trip() -> YAML:
    editor = YAML()
    editor.preserve_quotes = True
    editor.width = 4096  # never fold a long value onto a second line
    # ruamel writes None as an empty value by default; params.yaml says null
    editor.representer.add_representer(
        type(None), lambda dump, _: dump.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    return editor


def _node(value: Any) -> Any:
    """``value`` as a YAML node that reads back as itself: params.yaml is read as YAML 1.1 (omegaconf), where a bare
    ``Y``, ``on`` or ``no`` is a boolean, so a string that would not read back as itself is quoted."""
    if isinstance(value, dict):
        return CommentedMap((key, _node(item)) for key, item in value.items())
    if isinstance(value, list):
        return CommentedSeq(_node(item) for item in value)
    if isinstance(value, str):
        try:
            plain = yaml.safe_load(value) == value
        except yaml.YAMLError:
            plain = False
        return value if plain else SingleQuotedScalarString(value)
    return value


def _entry(mapping: CommentedMap, name: str) -> Any:
    """The key of ``mapping`` a dotted part names: ``rounds.1`` may be the integer 1 in the file."""
    return int(name) if name not in mapping and name.isdigit() and int(name) in mapping else name


def _set(mapping: CommentedMap, value: Any, replace_at: int | None = None) -> None:
    """Merge ``value`` (a nested dict, as omegaconf reads a dotlist) into ``mapping``, leaf by leaf, as load_params
    merges an override over the file; a leaf replaces what was there, and so does the dict ``replace_at`` levels
    down (an override stating a whole reward mix or dataset mix, as load_params reads it)."""
    for name, item in value.items():
        key = _entry(mapping, str(name))
        if isinstance(item, dict) and isinstance(mapping.get(key), dict) and replace_at != 1:
            _set(mapping[key], item, None if replace_at is None else replace_at - 1)
        else:
            mapping[key] = _node(item)


def write_overrides(params_file: Path, overrides: Sequence[str]) -> None:
    """Set ``overrides`` (validated already) in ``params_file``, keeping everything else as it was, atomically."""
    editor = _round_trip()
    document = editor.load(Path(params_file).read_text())
    for override in overrides:
        key = override.partition("=")[0].strip()
        replace_at = key.count(".") + 1 if key in REPLACED_BY_THE_FILE else None
        _set(document, OmegaConf.to_container(OmegaConf.from_dotlist([override])), replace_at)
    text = io.StringIO()
    editor.dump(document, text)
    with atomic_output(Path(params_file), with_the_stage=False) as temporary:
        temporary.write_text(text.getvalue())


def restore(params_file: Path, before: bytes) -> None:
    """Put ``params_file``'s bytes back as ``before``, atomically: what an interrupted run wrote into it undone."""
    with atomic_output(Path(params_file), with_the_stage=False) as temporary:
        temporary.write_bytes(before)
