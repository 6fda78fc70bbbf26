"""Pieces every training stage shares: determinism, the optimiser and schedule, and resumable checkpoints."""

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from tasks.common.artifacts import CHECKPOINTS, atomic_output


def make_deterministic(seed: int) -> None:
    """Seed every generator and pick deterministic kernels, so equal params give bit-equal weights."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)


def adamw_with_cosine(
    model: torch.nn.Module, lr: float, weight_decay: float, warmup_steps: int, total_steps: int | None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (no decay on biases and norms) with linear warm-up, then cosine decay to zero over
    ``total_steps``, or a constant rate when ``total_steps`` is None (RL, where the data never ends)."""
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr)
    if total_steps is None:
        return optimizer, get_constant_schedule_with_warmup(optimizer, warmup_steps)
    return optimizer, get_cosine_schedule_with_warmup(optimizer, warmup_steps, total_steps)


def epoch_batch(num_items: int, batch_size: int, step: int, seed: int) -> list[int]:
    """The item indices of batch ``step`` when items are served in a fresh seeded order every epoch.

    A pure function of the step, so a resumed run continues at exactly the data position it stopped at.
    """
    steps_per_epoch = num_items // batch_size
    epoch, position = divmod(step, steps_per_epoch)
    order = torch.randperm(num_items, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return order[position * batch_size : (position + 1) * batch_size].tolist()


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def fingerprint(config: Any, inputs: list[Path]) -> str:
    """A digest of a stage's config and the content of its inputs: a checkpoint resumes only a matching run."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for root in inputs:
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(root)).encode())
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


class Checkpointer:
    """The latest resumable state of one stage's run, kept outside the stage's DVC outputs.

    DVC removes a stage's outputs before re-running it, so checkpoints live under
    ``.alignflow/checkpoints/<stage>/<fingerprint>``; a different config or input
    gets a different fingerprint and starts fresh.
    """

    def __init__(self, stage: str, run_fingerprint: str):
        self.root = CHECKPOINTS / stage
        self.path = self.root / run_fingerprint / "latest.pt"

    def load(self) -> dict[str, Any] | None:
        if not self.path.is_file():
            return None
        return torch.load(self.path, map_location="cpu", weights_only=False)

    def save(self, state: dict[str, Any]) -> None:
        with atomic_output(self.path) as temporary:
            torch.save(state, temporary)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
