"""What the TRL legs of the benches share: the wall time of every optimizer step, from a trainer callback."""

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
