"""DVC's YAML parsing inside ``yaml_parsed_once``: each distinct text parsed once, every caller its own copy, a
failure not remembered, DVC's own parser back afterwards."""

import pytest
from dvc.utils import serialize, strictyaml
from dvc.utils.serialize import _yaml

from flows.yaml_once import yaml_parsed_once


def test_each_text_is_parsed_once_and_every_caller_gets_its_own_copy(monkeypatch):
    parsed = []
    original = _yaml.parse_yaml

    def counting(text, path, typ="safe"):
        parsed.append(text)
        return original(text, path, typ)

    monkeypatch.setattr(_yaml, "parse_yaml", counting)
    with yaml_parsed_once():
        first = serialize.parse_yaml("a: {b: 1}\n", "params.yaml")
        first["a"]["b"] = 2  # a caller changing what it got changes nobody else's
        second = strictyaml.parse_yaml("a: {b: 1}\n", "/abs/params.yaml")
        other = _yaml.parse_yaml("c: 3\n", "dvc.lock")
        with pytest.raises(_yaml.YAMLFileCorruptedError, match="bad.yaml"):
            serialize.parse_yaml("a: [\n", "bad.yaml")
        with pytest.raises(_yaml.YAMLFileCorruptedError, match="again.yaml"):
            serialize.parse_yaml("a: [\n", "again.yaml")
    assert second == {"a": {"b": 1}} and other == {"c": 3}
    assert parsed == ["a: {b: 1}\n", "c: 3\n", "a: [\n", "a: [\n"]
    assert _yaml.parse_yaml is counting and strictyaml.parse_yaml is serialize.parse_yaml is original
