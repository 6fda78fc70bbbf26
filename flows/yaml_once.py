"""DVC's YAML parsing, once per text for the length of a command.

One no-op ``dvc repro`` of the default pipeline parses params.yaml eight times, dvc.yaml and dvc.lock three times
each (per stage's params, per index build), and those 14 parses are a fifth of the command: ``yaml_parsed_once``
parses each distinct text once and hands every caller its own deep copy (DVC may change what it is given). A file
that changes meanwhile (dvc.lock after each stage) is new text, parsed anew; a text that fails to parse is not
remembered, so each caller gets its own error naming its path.
"""

import copy
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# The names DVC calls its YAML parser by (dvc.yaml and dvc.lock through strictyaml, params through serialize).
_PARSERS = ("dvc.utils.serialize._yaml.parse_yaml", "dvc.utils.serialize.parse_yaml", "dvc.utils.strictyaml.parse_yaml")


def _once(parse: Callable[..., Any]) -> Callable[..., Any]:
    parsed: dict[tuple[str, str], Any] = {}

    def parse_once(text: str, path: Any, typ: str = "safe") -> Any:
        if (text, typ) not in parsed:
            parsed[text, typ] = parse(text, path, typ)
        return copy.deepcopy(parsed[text, typ])

    return parse_once


@contextmanager
def yaml_parsed_once() -> Iterator[None]:
    """Inside: DVC parses each distinct YAML text once (see the module docstring)."""
    names = [(importlib.import_module(name.rpartition(".")[0]), name.rpartition(".")[2]) for name in _PARSERS]
    originals = [getattr(module, attribute) for module, attribute in names]
    parse_once = _once(originals[0])
    for module, attribute in names:
        setattr(module, attribute, parse_once)
    try:
        yield
    finally:
        for (module, attribute), original in zip(names, originals, strict=True):
            setattr(module, attribute, original)
