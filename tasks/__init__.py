"""Stages, one module per stage kind, and the pure algorithm math they share (``core_algos``).

``run_stage`` maps a dvc.yaml stage name to its module: ``sft`` runs ``tasks.sft.run(params)``;
``eval@sft`` runs ``tasks.eval.run(params, "sft")``, the ``@`` naming the model it works on.
"""

import importlib

from tasks.config import Params

# stage kind -> (module, whether the stage name carries an @target)
STAGE_KINDS: dict[str, tuple[str, bool]] = {
    "data": ("tasks.data", False),
    "base": ("tasks.base", False),
    "sft": ("tasks.sft", False),
    "preferences": ("tasks.preferences", False),
    "reward": ("tasks.reward", False),
    "ppo": ("tasks.ppo", False),
    "eval": ("tasks.eval", True),
}


def check_stage_name(name: str) -> None:
    kind, _, target = name.partition("@")
    if kind not in STAGE_KINDS:
        raise ValueError(f"unknown stage {name!r} (stages: {', '.join(_usage())})")
    if STAGE_KINDS[kind][1] != bool(target):
        raise ValueError(f"stage {name!r}: expected {'`' + kind + '@<model>`' if STAGE_KINDS[kind][1] else kind!r}")


def run_stage(name: str, params: Params) -> None:
    check_stage_name(name)
    kind, _, target = name.partition("@")
    module = importlib.import_module(STAGE_KINDS[kind][0])
    module.run(params, target) if target else module.run(params)


def _usage() -> list[str]:
    return [f"{kind}@<model>" if takes_target else kind for kind, (_, takes_target) in STAGE_KINDS.items()]
