"""The pipelines alignflow knows, by name: what each trains and which dvc.yaml stages it ends in."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Pipeline:
    description: str
    targets: tuple[str, ...]  # the final stages; a run covers them and everything upstream


PIPELINES: dict[str, Pipeline] = {
    "sft": Pipeline(
        "Supervised fine-tuning: data -> base -> sft, with held-out evaluation of base and sft.",
        ("eval@base", "eval@sft"),
    ),
    "rlhf": Pipeline(
        "RLHF (InstructGPT): data -> base -> sft -> preference pairs judged -> Bradley-Terry reward model "
        "-> PPO, with held-out evaluation of base, sft and ppo.",
        ("eval@base", "eval@sft", "eval@ppo"),
    ),
}
