"""The params a stage sees: only the keys its kind declares in tasks/kinds.yaml.

dvc.yaml lists a stage's ``params:`` from its kind's declaration, so a key the stage reads but does not declare is
one whose change re-runs nothing: a stale result nobody sees. A stage therefore runs on a view of params that
holds the declared sections and keys (and the operations sections, which say how a run is operated, not what it
computes) and refuses any other read, naming the stage, the key and the file to declare it in.
"""

from __future__ import annotations

from typing import Any

from tasks.common.config import Params
from tasks.common.config.operations import OperationsSections
from tasks.kinds import DECLARATIONS, StageKind

# How a run is operated (Prefect retries, Ray address and resources, the remote, the retraining gate): read by
# any stage, never a dvc.yaml dependency, since none of them changes what a stage computes.
OPERATIONS = frozenset(OperationsSections.__dataclass_fields__)


class UndeclaredParamError(LookupError):
    """A stage read a params key its kind does not declare. Not an AttributeError, so that ``getattr(x, key,
    default)`` and ``hasattr`` cannot quietly turn an undeclared read into a default."""


class DeclaredParams:
    """``target`` (all of params, or a section of it at ``path``) as the stage ``stage`` may read it: a declared key
    or anything under one reads as itself; a key with declared keys below it reads as a view of those."""

    def __init__(self, target: Any, declared: frozenset[str], stage: str, path: str = "") -> None:
        self._target, self._declared, self._stage, self._path = target, declared, stage, path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # copy, pickle and other libraries probe for protocols: no params key starts so
            raise AttributeError(name)
        value = getattr(self._target, name)
        key = f"{self._path}.{name}" if self._path else name
        if self._path == "" and name in OPERATIONS:
            return value
        if any(key == d or key.startswith(f"{d}.") for d in self._declared):
            return value
        if any(d.startswith(f"{key}.") for d in self._declared):
            return DeclaredParams(value, self._declared, self._stage, key)
        raise UndeclaredParamError(
            f"stage {self._stage!r} read params key {key!r}, which its kind does not declare: add it to the kind's "
            f"params in {DECLARATIONS} (then `alignflow generate`), or stop reading it"
        )

    def __reduce__(self) -> tuple:
        # Ray and the sandboxes pickle what a stage hands them: the view travels as a view.
        return DeclaredParams, (self._target, self._declared, self._stage, self._path)

    def __repr__(self) -> str:
        return f"DeclaredParams({self._stage!r}, {self._path or 'params'}: {sorted(self._declared)})"


def declared_params(params: Params, kind: StageKind, stage: str) -> Params:
    """``params`` as the stage ``stage`` of ``kind`` may read it (typed as Params: it reads like one)."""
    return DeclaredParams(params, frozenset(kind.param_keys), stage)  # type: ignore[return-value]
