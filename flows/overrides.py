"""The typed parameter form of a pipeline run, generated from the params dataclasses.

Prefect builds a deployment's form (and validates runs created through its API)
from the flow's signature; the flow takes one ``Overrides`` argument, a pydantic
model mirroring ``tasks.common.config.Params`` section by section with every field
optional (unset: keep params.yaml) and carrying the same help, ranges and
choices. The flow then re-validates through ``load_params``, so cross-field rules
(max length vs prompt length, paths that must exist) hold for UI runs exactly as
for the CLI.
"""

import dataclasses
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from tasks.common.config import Params
from tasks.common.params import choices

# Where work is placed (Ray addresses, resources) is the deployment's business, not a run's: it stays in params.yaml.
_PLACEMENT = ("runner", "roles")


def _field(annotation: Any, f: dataclasses.Field) -> tuple[Any, Any]:
    checks = f.metadata
    if (allowed := choices(f)) is not None:
        annotation = Literal[allowed]
    bounds = {name: checks[name] for name in ("gt", "ge", "lt", "le") if name in checks}
    return annotation | None, Field(None, description=checks.get("help"), **bounds)


def _model(cls: type, name: str, description: str, prefix: str = "") -> type[BaseModel]:
    hints = typing.get_type_hints(cls)
    fields = {}
    for f in dataclasses.fields(cls):
        if f.name in _PLACEMENT:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            sub = _model(hints[f.name], f"{name}{f.name.title()}", f.metadata["help"], f"{prefix}{f.name}.")
            fields[f.name] = (sub | None, Field(None, description=f.metadata.get("help")))
        else:
            fields[f.name] = _field(hints[f.name], f)
    return create_model(name, __config__=ConfigDict(extra="forbid"), __doc__=description, **fields)


Overrides = _model(Params, "Overrides", "Settings for this run; anything left empty keeps its value in params.yaml.")


def to_dotlist(overrides: BaseModel | dict | None) -> list[str]:
    """The set fields of an Overrides as omegaconf dotlist entries: ``["sft.lr=0.0001", ...]``."""
    if overrides is None:
        return []
    values = overrides.model_dump(exclude_none=True) if isinstance(overrides, BaseModel) else overrides

    def flatten(tree: dict, prefix: str = "") -> list[str]:
        entries = []
        for key, value in tree.items():
            if isinstance(value, dict):
                entries += flatten(value, f"{prefix}{key}.")
            elif value is not None:
                entries.append(f"{prefix}{key}={value}")
        return entries

    return flatten(values)
