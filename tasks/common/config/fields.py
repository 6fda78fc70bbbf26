"""The building blocks of the params schema: documented, constrained fields on pydantic dataclasses.

A field's help is its ``description`` and its constraints are pydantic's (``gt``, ``ge``, ``lt``, ``le`` in
``Field``, a choice as ``OneOf``), so one schema validates params.yaml, prints ``--help`` and builds the
Prefect run form. Sections are pydantic dataclasses rather than models: they stay plain dataclasses to the
code that trains (``dataclasses.replace`` validates too), and omegaconf loads and merges what they check.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from pydantic import AllowInfNan, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.dataclasses import dataclass
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, core_schema

from tasks.common.registry_catalog import registry_entries

# Unknown keys are refused and no float may be inf or nan (a weight of inf in a loss is never meant).
SCHEMA = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
T = TypeVar("T")
# A weight or tolerance in a mapping: a non-finite one is reported by the cross-field checks, naming its entry.
Weight = Annotated[float, AllowInfNan(True)]


class ConfigError(ValueError):
    """A configuration that fails validation; the message names the offending key."""


def schema_section(cls: type[T]) -> type[T]:
    """A section of params.yaml: a pydantic dataclass that refuses unknown keys and non-finite floats."""
    return dataclass(config=SCHEMA)(cls)


def param(default: Any, help: str, *, why: str | None = None, **bounds: Any) -> Any:
    """A documented field: ``help`` is its description; ``bounds`` are pydantic's numeric constraints (gt, ge, lt,
    le); ``why`` says what a value above ``le`` would cost, for the error."""
    extra = {"why": why} if why else None
    return Field(default, description=help, json_schema_extra=extra, **bounds)


def mapping(factory: Callable[[], Any], help: str) -> Any:
    """A documented dict-valued field (reward weights, resources by role, rounds by name)."""
    return Field(default_factory=factory, description=help)


def section(cls: type, help: str, **defaults: Any) -> Any:
    """A section of ``Params``: ``cls`` with ``defaults`` over its own, the one way a section sets defaults of its
    own (``sft_cold`` is an ``SFTConfig`` with fewer steps)."""
    return Field(default_factory=lambda: cls(**copy.deepcopy(defaults)), description=help)


class OneOf:
    """A string constraint: one of fixed ``choices``, or of the names a registry holds (``registry``:
    "module:NAME", read from the registries' catalog so that reading params needs no torch), plus ``extra``."""

    def __init__(self, choices: Sequence[str] = (), *, registry: str | None = None, extra: Sequence[str] = ()) -> None:
        self._choices, self.registry, self._extra = tuple(choices), registry, tuple(extra)

    @property
    def choices(self) -> tuple[str, ...]:
        if self.registry is None:
            return self._choices
        return (*self._extra, *registry_entries(self.registry))

    def _check(self, value: str) -> str:
        if value not in self.choices:
            raise PydanticCustomError(
                "one_of",
                "must be one of {choices}, got {got}",
                {"choices": ", ".join(self.choices), "got": repr(value)},
            )
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {**handler(schema), "enum": list(self.choices)}


class MadeOf:
    """A string constraint: non-empty, of the characters ``chars`` only (the operations a task draws from)."""

    def __init__(self, chars: str) -> None:
        self.chars = chars

    def _check(self, value: str) -> str:
        if not value or set(value) - set(self.chars):
            raise PydanticCustomError(
                "made_of", "must be made of {chars}, got {got}", {"chars": ", ".join(self.chars), "got": repr(value)}
            )
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))


def schema_fields(cls: type) -> dict[str, FieldInfo]:
    """The fields of a section type: each one's help (``description``), constraints (``metadata``) and type."""
    return cls.__pydantic_fields__


def to_dict(config: Any) -> dict[str, Any]:
    """A section as plain data: what a checkpoint's fingerprint and a run's summary record."""
    return dataclasses.asdict(config)
