"""Reading params.yaml: omegaconf loads, merges and interpolates the file and ``key=value`` overrides; the pydantic
schema (``tasks/common/config``) checks every type and bound; the cross-field rules here check the rest.

Every error is collected in one pass, so a bad file reports all of them at once, each naming its
full key (``sft.lr: must be > 0, got -0.001``), before any stage starts.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from tasks.common.config import (
    ConfigError,
    Params,
)
from tasks.common.config.fields import schema_fields
from tasks.common.declared_params import OPERATIONS
from tasks.common.errors import warn
from tasks.kinds import stage_kinds
from tasks.params.rules import RL_SECTIONS, cross_field_errors, cross_field_warnings, reward_import_errors
from tasks.params.task_rules import reasoning_gym_errors, textarena_errors
from tasks.pipelines import kinds_run


def _unwrap(annotation: Any) -> Any:
    """The type a field holds, without its ``| None``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    return annotation


def fields_with_keys(config: Any, prefix: str = "") -> Iterator[tuple[str, FieldInfo, Any]]:
    """Every leaf field of a config tree as (dotted key, field, value); a mapping of sections (``rounds``) is
    walked entry by entry."""
    for name, info in schema_fields(type(config)).items():
        value = getattr(config, name)
        key = f"{prefix}{name}"
        if dataclasses.is_dataclass(value):
            yield from fields_with_keys(value, f"{key}.")
        elif isinstance(value, dict) and value and all(dataclasses.is_dataclass(v) for v in value.values()):
            for entry, item in value.items():
                yield from fields_with_keys(item, f"{key}.{entry}.")
        else:
            yield key, info, value


def field_at(key: str) -> FieldInfo | None:
    """The schema field of a dotted key (``sft.parallel.num_workers``, ``rounds.1.policy``); None for none."""
    cls, info = Params, None
    parts = key.split(".")
    while parts:
        if not dataclasses.is_dataclass(cls):
            if typing.get_origin(cls) is not dict:
                return None
            parts.pop(0)  # a mapping's entry name
            cls = _unwrap(typing.get_args(cls)[1])
            continue
        info = schema_fields(cls).get(parts.pop(0))
        if info is None:
            return None
        cls = _unwrap(info.annotation)
    return info


def _number(bound: Any) -> Any:
    """A bound as the schema states it: 1 rather than pydantic's 1.0 for a float field bounded by 1."""
    return int(bound) if isinstance(bound, float) and bound.is_integer() else bound


def _why(key: str) -> str:
    info = field_at(key)
    extra = info.json_schema_extra if info is not None and isinstance(info.json_schema_extra, dict) else {}
    return f" ({extra['why']})" if "why" in extra else ""


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _as_read(value: Any) -> str:
    """What YAML made of an override's text, in words."""
    if value is None:
        return "null (no value)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    return f"a {'list' if isinstance(value, list) else 'mapping'}, {json.dumps(value)}"


def _override_reading(key: str, overrides: dict[str, str]) -> str:
    """For a key an override set to something YAML reads as another type (``Yes``, ``on``, ``-``, nothing): what it
    was read as and how to quote it; empty for any other key."""
    if key not in overrides:
        return ""
    text = overrides[key].partition("=")[2]
    read = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={text}"]))["value"]
    if isinstance(read, str):
        return ""
    return (
        f" (the override {overrides[key]!r}: YAML reads {text!r} as {_as_read(read)}; for the text, quote it: "
        f"'{key}=\"{text}\"' in a shell)"
    )


def _booleans_for_numbers(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """A boolean where the schema wants a number: pydantic would read true as 1 (``max_staleness=true``)."""
    for name, value in values.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            yield from _booleans_for_numbers(value, f"{key}.")
        elif isinstance(value, bool) and (info := field_at(key)) is not None:
            wanted = _unwrap(info.annotation)
            if wanted not in (int, float):
                continue
            what = "an integer" if wanted is int else "a number"
            yield f"{key}: must be {what}, got the boolean {str(value).lower()}"


def schema_errors(error: ValidationError, overrides: Sequence[str] = ()) -> list[str]:
    """pydantic's errors as ``key: what is wrong``, in the words the CLI has always used; a value an override gave
    that YAML read as another type than its text says what it was read as."""
    given = {override.partition("=")[0].strip(): override for override in overrides}
    messages = []
    for problem in error.errors():
        key, kind, got = ".".join(str(part) for part in problem["loc"]), problem["type"], problem.get("input")
        if kind.endswith("_type") and (reading := _override_reading(key, given)):
            messages.append(f"{key}: {problem['msg']}{reading}")
            continue
        if kind in ("unexpected_keyword_argument", "extra_forbidden"):
            messages.append(f"{key}: unknown key")
        elif kind in _BOUNDS:
            bound = _number(next(iter(problem["ctx"].values())))
            why = _why(key) if kind == "less_than_equal" else ""
            messages.append(f"{key}: must be {_BOUNDS[kind]} {bound}, got {got}{why}")
        elif kind == "finite_number":
            messages.append(f"{key}: must be a finite number, got {got}")
        else:
            messages.append(f"{key}: {problem['msg']}")
    return messages


_PARAMS = TypeAdapter(Params)


# Dict-valued params that params.yaml states in full (its dict replaces the default rather than adding to it).
REPLACED_BY_THE_FILE = (
    *(f"{name}.rewards" for name in RL_SECTIONS),
    "ppo.verifier_rewards",
    "rounds",
    "retrain.guards",
    "task.reasoning_gym.datasets",
)


def overrides_in_order(overrides: Sequence[str]) -> DictConfig:
    """The overrides as one config, each applied over those before it: one that states a whole mapping of
    REPLACED_BY_THE_FILE replaces what earlier ones set there (an overlay's mix over the entries of the overlay it
    includes), as write_overrides writes them; any other merges in."""
    merged = OmegaConf.create()
    for override in overrides:
        key = override.partition("=")[0].strip()
        value = OmegaConf.select(OmegaConf.from_dotlist([override]), key)
        OmegaConf.update(merged, key, value, merge=key not in REPLACED_BY_THE_FILE)  # in place: no copy a line
    return merged


def validate(params: Params, runs: Sequence[str] | None = None, as_stages: bool = False) -> Params:
    """The cross-field rules (the schema has checked every field alone), then the reward functions' imports. With
    ``runs`` (pipelines, dvc.yaml stages or groups; stages only with ``as_stages``), only what concerns the stages a
    run of them runs: a rule whose key no such stage reads is another pipeline's business; without, all of params."""
    kinds = None if runs is None else kinds_run(runs, params, as_stages)
    in_scope = (lambda _: True) if kinds is None else _concerns(kinds)
    errors = [error for error in cross_field_errors(params) if in_scope(error)]
    if params.task.name == "reasoning_gym" and (kinds is None or "data" in kinds):  # builds datasets: only for data
        errors += reasoning_gym_errors(params)
    playing = (("data", params.task.name), ("agent_data", params.agent_data.task))
    if any(task == "textarena" and (kinds is None or section in kinds) for section, task in playing):  # makes a game
        errors += textarena_errors(params)
    if not errors:  # importing user code is the slow check: only once the rest holds
        errors += [error for error in reward_import_errors(params) if in_scope(error)]
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    for warning in filter(in_scope, cross_field_warnings(params)):
        warn(warning)
    return params


def _concerns(kinds: set[str]) -> Callable[[str], bool]:
    """Whether a rule's message concerns a stage of ``kinds``: its key (the text before the first colon) is or holds
    or lies under a key one of them reads, or names how runs are operated. A message without a key concerns all."""
    read = {key for kind in kinds for key in stage_kinds()[kind].param_keys} | set(OPERATIONS)

    def concerns(message: str) -> bool:
        key = message.partition(":")[0]
        if not re.fullmatch(r"[\w.\-]+", key):
            return True
        return any(key == r or key.startswith(f"{r}.") or r.startswith(f"{key}.") for r in read)

    return concerns


def _describe(error: OmegaConfBaseException) -> str:
    key = getattr(error, "full_key", None) or getattr(error, "key", None) or "?"
    message = str(error).splitlines()[0]
    if "not in" in message or "Could not find" in message:
        return f"{key}: unknown key"
    return f"{key}: {message}"


def _check_sections(layer: DictConfig, where: Any) -> None:
    """A section given as a scalar or a list (``sft=1``) names its key, which omegaconf's merge error does not."""
    for name, info in schema_fields(Params).items():
        is_section = dataclasses.is_dataclass(info.annotation) or typing.get_origin(info.annotation) is dict
        if is_section and name in layer and not isinstance(layer[name], DictConfig):
            raise ConfigError(f"{where}: {name}: must be a section of keys, got {layer[name]!r}")


def _defaults() -> DictConfig:
    """The schema's defaults as a tree that refuses unknown keys, but for the mappings (rewards, roles, rounds)
    whose entries are yours to name."""
    tree = OmegaConf.create(dataclasses.asdict(Params()))
    OmegaConf.set_struct(tree, True)

    def open_mappings(cls: type, node: DictConfig) -> None:
        for name, info in schema_fields(cls).items():
            annotation = _unwrap(info.annotation)
            if dataclasses.is_dataclass(annotation):
                open_mappings(annotation, node[name])
            elif typing.get_origin(annotation) is dict:
                OmegaConf.set_struct(node[name], False)

    open_mappings(Params, tree)
    return tree


def _merge(base: DictConfig, layer: DictConfig, where: Any) -> DictConfig:
    """``layer`` over ``base``; an error names the layer it came from (the file, or an override)."""
    try:
        return OmegaConf.merge(base, layer)
    except OmegaConfBaseException as error:
        raise ConfigError(f"{where}: {_describe(error)}") from None


def load_params(
    path: str | Path = "params.yaml",
    overrides: Sequence[str] = (),
    runs: Sequence[str] | None = None,
    as_stages: bool = False,
) -> Params:
    """Read ``path``, apply dotlist ``overrides`` (``sft.lr=1e-4``), validate (only what concerns a run of ``runs``
    when given: pipelines or dvc.yaml stages; ``validate``), and return typed params."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such params file")
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"override {override!r}: expected key=value")
        if not override.partition("=")[0].strip():
            raise ConfigError(f"override {override!r}: no key before '=' (expected key=value)")
    try:
        from_file = OmegaConf.load(path)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start} is {error.object[error.start]:#x})") from None
    if not isinstance(from_file, DictConfig) or not from_file:
        what = "empty" if from_file is None or not from_file else "a list, not a mapping of sections"
        raise ConfigError(f"{path}: {what}; it must set every stage's params by section (see the repo's params.yaml)")
    try:
        dotlist = overrides_in_order(overrides)
        for layer, where in ((from_file, path), (dotlist, "override")):
            _check_sections(layer, where)
        merged = _merge(_merge(_defaults(), from_file, path), dotlist, "override")
        stated = {override.partition("=")[0].strip() for override in overrides}
        for key in REPLACED_BY_THE_FILE:
            # omegaconf merges dicts key by key; a reward mix or a list of rounds written out means exactly that,
            # in the file or in an override that states the whole mapping (`grpo.rewards={mine:fn: 1.0}`)
            layers = [OmegaConf.select(dotlist, key)]
            if key not in stated:
                layers.insert(0, OmegaConf.select(from_file, key))
            if layers[0] is not None:
                OmegaConf.update(merged, key, {}, merge=False)
                OmegaConf.set_struct(OmegaConf.select(merged, key), False)  # its entries are yours to name
                for layer in layers:
                    if layer is not None:
                        OmegaConf.update(merged, key, layer, merge=True)
        values = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as error:
        # a value that fails to resolve (an interpolation) is the override's when an override set it
        given = {item.partition("=")[0].strip(): item for item in overrides}
        where = f"override {given[key]!r}" if (key := getattr(error, "full_key", None)) in given else path
        raise ConfigError(f"{where}: {_describe(error)}") from None
    if errors := list(_booleans_for_numbers(values)):
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    try:
        params = _PARAMS.validate_python(values)
    except ValidationError as error:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(schema_errors(error, overrides))) from None
    return validate(params, runs, as_stages)
