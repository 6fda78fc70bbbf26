"""Stage names resolved through the stage kinds the params schema declares (``config.StageKind``).

A stage's name is its kind, then ``@`` and a target for kinds that take one: ``sft``,
``eval@sft`` (the model it evaluates), ``grpo_final@1`` (the round).
"""

from __future__ import annotations

import importlib

from tasks.common.config import ConfigError, Params, StageKind, stage_kinds


def usage_name(kind: StageKind) -> str:
    return f"{kind.name}@{kind.target.upper()}" if kind.target else kind.name


def parse_stage_name(name: str) -> tuple[StageKind, str | None]:
    """The kind and target of a stage name; a clear error for an unknown kind or a misplaced target."""
    kinds = stage_kinds()
    kind_name, _, target = name.partition("@")
    if kind_name not in kinds:
        known = ", ".join(usage_name(kind) for kind, _ in kinds.values())
        raise ConfigError(f"unknown stage {name!r} (stages: {known})")
    kind = kinds[kind_name][0]
    if bool(kind.target) != bool(target):
        raise ConfigError(f"stage {name!r}: expected {usage_name(kind)!r}")
    return kind, target or None


def run_stage(name: str, params: Params) -> None:
    """Run the stage ``name`` (as dvc.yaml names it) with ``params``."""
    kind, target = parse_stage_name(name)
    module, _, function = kind.entry.partition(":")
    stage = getattr(importlib.import_module(module), function)
    stage(params, target) if target else stage(params)


def model_kinds() -> tuple[list[str], list[str]]:
    """The stage kinds that train a model: (one model each, one model per round)."""
    models = [kind for kind, _ in stage_kinds().values() if kind.writes == "model"]
    return [kind.name for kind in models if kind.target is None], [kind.name for kind in models if kind.target]
