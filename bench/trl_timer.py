"""What the TRL legs of the benches share: the wall time of every optimizer step, from a trainer callback, and the
LoRA config of a leg that trains adapters."""

import time

from transformers import TrainerCallback


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (with whatever the trainer does inside it: generation, reference passes)."""

    def __init__(self):
        self.seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self.started)


def peft_config(lora: dict | None):
    """PEFT's LoraConfig of alignflow's ``lora`` section (rank, alpha, dropout, target_modules); None: no adapters."""
    if not lora:
        return None
    from peft import LoraConfig

    targets = lora["target_modules"]
    return LoraConfig(
        r=lora["rank"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules="all-linear" if "all-linear" in targets else list(targets),
    )
