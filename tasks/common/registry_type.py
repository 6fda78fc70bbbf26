"""Named plug-ins: the one registry type behind every "pick by name" param (advantage estimators, policy losses and
their aggregations, KL estimators, preference and distillation losses, built-in rewards).

A registry maps a name to a ``Registered`` entry: the function, callable as itself, and the metadata the code
around it reads instead of the name (``ADVANTAGE_ESTIMATORS["gae"].needs_critic``). It reads as a read-only
mapping of names, so a params check can list its choices with ``tuple(registry)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Registered(Generic[F]):
    """A registered function and its metadata, readable as attributes (``entry.needs_critic``)."""

    function: F
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # read through __dict__: unpickling asks for attributes before ``metadata`` is set
        metadata = self.__dict__.get("metadata", {})
        if name in metadata:
            return metadata[name]
        raise AttributeError(f"{type(self).__name__} has no {name!r}")


class UnknownName(KeyError):
    def __str__(self) -> str:  # KeyError would print the message's repr
        return str(self.args[0])


class Registry(Mapping[str, Registered[F]]):
    """Functions registered by name, with the metadata ``defaults`` declares (and only that: a misspelt key is an
    error at registration, not a silent default)."""

    def __init__(self, kind: str, **defaults: Any) -> None:
        self.kind, self.defaults = kind, defaults
        self._entries: dict[str, Registered[F]] = {}

    def register(self, name: str, **metadata: Any) -> Callable[[F], F]:
        """A decorator registering its function as ``name``, with ``metadata`` over the registry's defaults."""
        unknown = set(metadata) - set(self.defaults)
        if unknown:
            raise TypeError(
                f"{self.kind} {name!r}: unknown metadata {sorted(unknown)} (known: {sorted(self.defaults)})"
            )
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered already")

        def register(function: F) -> F:
            self._entries[name] = Registered(function, {**self.defaults, **metadata})
            return function

        return register

    def __getitem__(self, name: str) -> Registered[F]:
        if name not in self._entries:
            raise UnknownName(f"no {self.kind} {name!r}; registered: {', '.join(self._entries)}")
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
