"""Stages, one module per stage kind, and the pure algorithm math they share (``core_algos``).

``run_stage`` maps a dvc.yaml stage name to the function that runs it: ``sft`` runs
``tasks.sft.run(params)``; ``eval@sft`` runs ``tasks.eval.run(params, "sft")``, the part after
``@`` naming the model it works on (for eval) or the round (for the R1 round stages).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # tasks.problems must stay importable without the training stack (bench/trl_grpo.py)
    from tasks.config import Params


class StageKind(NamedTuple):
    function: str  # module:function
    target: str | None  # what follows the @ in the stage's name, if it takes one


STAGE_KINDS: dict[str, StageKind] = {
    "data": StageKind("tasks.data:run", None),
    "base": StageKind("tasks.base:run", None),
    "sft": StageKind("tasks.sft:run", None),
    "preferences": StageKind("tasks.preferences:run", None),
    "reward": StageKind("tasks.reward:run", None),
    "ppo": StageKind("tasks.ppo:run", None),
    "sft_cold": StageKind("tasks.sft:run_cold_start", None),
    "grpo": StageKind("tasks.grpo:run", None),
    "grpo_zero": StageKind("tasks.grpo:run_zero", None),
    "rejection": StageKind("tasks.rejection:run", "round"),
    "sft_rs": StageKind("tasks.sft:run_round", "round"),
    "grpo_final": StageKind("tasks.grpo:run_final", "round"),
    "eval": StageKind("tasks.eval:run", "model"),
}


def check_stage_name(name: str) -> None:
    kind, _, target = name.partition("@")
    if kind not in STAGE_KINDS:
        raise ValueError(f"unknown stage {name!r} (stages: {', '.join(_usage())})")
    expected = STAGE_KINDS[kind].target
    if bool(expected) != bool(target):
        raise ValueError(f"stage {name!r}: expected {_name(kind, expected)!r}")


def run_stage(name: str, params: Params) -> None:
    check_stage_name(name)
    kind, _, target = name.partition("@")
    module, _, function = STAGE_KINDS[kind].function.partition(":")
    stage = getattr(importlib.import_module(module), function)
    stage(params, target) if target else stage(params)


def _name(kind: str, target: str | None) -> str:
    return f"{kind}@<{target}>" if target else kind


def _usage() -> list[str]:
    return [_name(kind, target) for kind, (_, target) in STAGE_KINDS.items()]
