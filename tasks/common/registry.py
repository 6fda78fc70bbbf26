"""Stage names and inputs, resolved through the stage kinds ``tasks/kinds.py`` declares.

A stage's name is its kind, then ``@`` and a target for kinds that take one: ``sft``,
``eval@sft`` (the model it evaluates), ``grpo_final@1`` (the round). Its inputs are its kind's
``reads``, each ``${...}`` resolved through params and the target.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.common.artifacts import landing_together, stage_dir, stage_lock, upstream_model
from tasks.common.config import ConfigError, Params
from tasks.common.declared_params import declared_params
from tasks.kinds import StageKind, model_kinds, stage_kinds


def usage_name(kind: StageKind) -> str:
    return f"{kind.name}@{kind.target.upper()}" if kind.target else kind.name


def parse_stage_name(name: str) -> tuple[StageKind, str | None]:
    """The kind and target of a stage name; a clear error for an unknown kind or a misplaced target."""
    kinds = stage_kinds()
    kind_name, _, target = name.partition("@")
    if kind_name not in kinds:
        known = ", ".join(usage_name(kind) for kind in kinds.values())
        raise ConfigError(f"unknown stage {name!r} (stages: {known})")
    kind = kinds[kind_name]
    if bool(kind.target) != bool(target):
        raise ConfigError(f"stage {name!r}: expected {usage_name(kind)!r}")
    return kind, target or None


def param_reference(read: str, section: str) -> str | None:
    """The params key a read names: ``${init}`` a key of its own section (``sft.init``), ``${distill.teacher}``
    another section's; None for a stage (``data``) or its target (``${model}``, ``${round}``, ``${round.policy}``)."""
    if not read.startswith("${"):
        return None
    name = read[2:-1]
    if name.partition(".")[0] in Params.__pydantic_fields__:
        return name
    return f"{section}.{name}" if "." not in name and name not in ("model", "round") else None


def param_value(params: Params, key: str) -> Any:
    value: Any = params
    for part in key.split("."):
        value = getattr(value, part)
    return value


def read_artifacts(kind: StageKind, params: Params, target: str | None = None) -> dict[str, str]:
    """What a stage of ``kind`` reads, by input name, as artifact names (``data``, ``grpo``, ``rejection@1``,
    ``sft_rs/1``): its declared reads, each ``${...}`` resolved through params and ``target``."""
    resolved = {}
    for name, read in kind.reads.items():
        key = param_reference(read, kind.section)
        if key is not None:
            read = str(param_value(params, key))
        elif target is not None:
            read = read.replace("${round.policy}", params.rounds[target].policy if kind.target == "round" else "")
            read = read.replace(f"${{{kind.target}}}", target)
        resolved[name] = read
    return resolved


class StageInputs(Mapping[str, Path]):
    """A stage's inputs by name, each an artifact directory resolved when the stage first asks for it: a stage that
    does not need one this time (preferences of your own need no policy to sample) does not need it to exist."""

    def __init__(self, artifacts: dict[str, str]) -> None:
        self.artifacts = artifacts  # input name -> artifact name (``sft_rs@1``, ``data``)

    def __getitem__(self, name: str) -> Path:
        artifact = self.artifacts[name]
        kind = stage_kinds().get(artifact.replace("@", "/").partition("/")[0])
        # Anything but a dataset is a model: an unknown name is an error naming the models, never a hub download.
        return stage_dir(artifact) if kind is not None and kind.writes != "model" else upstream_model(artifact)

    def __iter__(self) -> Iterator[str]:
        return iter(self.artifacts)

    def __len__(self) -> int:
        return len(self.artifacts)


@dataclass(frozen=True)
class StageRun:
    """One stage to run: its name (``grpo_final@1``), kind, params (only what its kind declares:
    tasks/common/declared_params.py) and inputs (artifact directories by name)."""

    name: str
    kind: StageKind
    params: Params
    inputs: StageInputs
    target: str | None = None

    @property
    def config(self) -> Any:
        """The params section the stage runs with."""
        return getattr(self.params, self.kind.section)


def stage_run(name: str, params: Params) -> StageRun:
    """The stage ``name`` with its inputs; an unknown round is refused before anything runs."""
    kind, target = parse_stage_name(name)
    if kind.target == "round" and target not in params.rounds:
        raise ConfigError(f"stage {name!r}: no round {target!r} in rounds ({', '.join(params.rounds)})")
    if kind.target == "model":
        models, round_models = model_kinds(kind.name)
        model, _, round_name = target.replace("@", "/").partition("/")
        if not ((model in models and not round_name) or (model in round_models and round_name in params.rounds)):
            rounds = f", or {'|'.join(round_models)}/ROUND with ROUND in rounds: {', '.join(params.rounds)}"
            raise ConfigError(
                f"stage {name!r}: no stage trains a model named {target!r} that {kind.name} evaluates (models: "
                f"{', '.join(models)}"
                f"{rounds if round_models else ''})"
            )
    inputs = StageInputs(read_artifacts(kind, params, target))
    return StageRun(name, kind, declared_params(params, kind, name), inputs, target)


def with_precisions_resolved(params: Params) -> Params:
    """``params`` with every section's ``precision: auto`` made what this machine's device computes best
    (``models.trainable.resolved_precision``): a stage sees only concrete precisions."""
    from models import resolve_device
    from models.trainable import resolved_precision
    from tasks.common.config import InferenceConfig

    device = resolve_device(params.device)
    for field in dataclasses.fields(params):
        cfg = getattr(params, field.name)
        if getattr(cfg, "precision", None) == "auto":
            bf16 = "bf16" if isinstance(cfg, InferenceConfig) else "bf16-mixed"
            setattr(params, field.name, dataclasses.replace(cfg, precision=resolved_precision("auto", device, bf16)))
    return params


def run_stage(name: str, params: Params) -> None:
    """Run the stage ``name`` (as dvc.yaml names it) with ``params``, its precisions resolved."""
    run = stage_run(name, with_precisions_resolved(params))
    module, _, function = run.kind.entry.partition(":")
    with stage_lock(name), landing_together():
        getattr(importlib.import_module(module), function)(run)
    if params.tracking.to:  # its outputs have landed: the trackers get what DVCLive wrote
        from tasks.common.trackers import export, param_values, stage_record

        values = param_values(params, run.kind.param_keys)
        export(stage_record(name, values, run.inputs.artifacts, Path.cwd()), params.tracking)
