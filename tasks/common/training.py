"""Pieces every training stage shares: determinism, the optimiser and schedule, resumable checkpoints, the
fixed-length training loop (``fit``: SFT, DPO, the reward model) and writing what it trained."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import random
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
)

from models.trainable import autocast, save_model
from tasks.common.artifacts import CHECKPOINTS, after_landing, atomic_output
from tasks.common.config import OptimizationConfig
from tasks.common.distributed import SINGLE, Rank, full_state_dict, load_training_state, training_state
from tasks.common.errors import NonFiniteError, cause
from tasks.common.flops import matmul_peak, mfu
from tasks.common.tracking import log_step, stage_live, write_perf

if TYPE_CHECKING:
    from dvclive import Live

DIVERGED = "diverged.json"  # beside a checkpoint: the run stopped on a non-finite quantity after saving it


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


def guarded_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    grad_clip: float,
    where: str,
    rank: Rank = SINGLE,
) -> torch.Tensor:
    """Backward, clip the gradient norm, and step, unless the loss or the norm is not finite: then nothing is
    updated and NonFiniteError names ``where`` and the quantity. Returns the (pre-clip) gradient norm.

    ``rank``: of the data-parallel group whose replicated gradients this step averages (a model that DDP wraps
    or FSDP shards averages its own); a loss that is not finite on any rank stops every rank."""
    optimizer.zero_grad(set_to_none=True)
    check_loss(optimizer, loss.detach(), where, rank)
    loss.backward()
    return clipped_step(model, optimizer, grad_clip, where, rank)


def check_loss(optimizer: torch.optim.Optimizer, loss: torch.Tensor, where: str, rank: Rank = SINGLE) -> None:
    """NonFiniteError naming ``where`` when the (detached) loss is not finite on any rank; the gradients are
    dropped first, so no step can take them."""
    total = rank.sum(loss)
    if not torch.isfinite(total):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(f"{where}: the loss is {total.item()}")


def clipped_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float, where: str, rank: Rank = SINGLE
) -> torch.Tensor:
    """The step on the gradients the backward passes left: averaged over the ranks, their norm clipped, unless the
    norm is not finite (then NonFiniteError naming ``where``, nothing updated). Returns the pre-clip norm."""
    rank.average_gradients(model)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(f"{where}: the gradient norm is {grad_norm.item()}")
    optimizer.step()
    return grad_norm


class Throughput:
    """Real tokens trained and the seconds they took, for a stage's tokens per second and MFU."""

    def __init__(self) -> None:
        self.tokens, self.seconds = 0, 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds

    def numbers(self, parameters: int, threads: int, workers: int) -> dict[str, float]:
        return {
            "parameters": parameters,
            "tokens_per_second": self.tokens / self.seconds,
            "mfu": mfu(parameters, self.tokens, self.seconds, threads, workers),
            "matmul_peak_gflops": matmul_peak(threads) * workers / 1e9,
        }


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


# What a user turns down after a divergence: a run that differs from a stopped one only in these resumes from
# the stopped run's last checkpoint (see Checkpointer.load).
RECOVERY_KNOBS = ("lr", "actor_lr", "critic_lr", "grad_clip")


def content_digest(inputs: list[Path]) -> str:
    """A digest of the files under ``inputs`` (names and bytes), read once however many fingerprints use it."""
    digest = hashlib.sha256()
    for root in inputs:
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(root)).encode())
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def fingerprint(config: Any, inputs_digest: str) -> str:
    """A digest of a stage's config and its inputs' ``content_digest``: a checkpoint resumes only a matching run."""
    return hashlib.sha256((json.dumps(config, sort_keys=True, default=str) + inputs_digest).encode()).hexdigest()[:16]


def require_finite(tensors: Any, where: str) -> None:
    """NonFiniteError naming ``where`` and the first tensor (by its key path) holding an inf or a nan."""
    stack = [("", tensors)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{key}.{name}".lstrip("."), item) for name, item in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{key}[{index}]", item) for index, item in enumerate(value))
        elif torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
            raise NonFiniteError(f"{where}: {key} holds non-finite values")


def restore_training_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    state: dict[str, Any],
) -> None:
    """Load a checkpoint's weights, optimiser moments and schedule position, keeping the learning rate this run
    is configured with: a run resumed after a divergence has usually lowered it. (Unchanged, it is bit-exact.)"""
    load_training_state(model, optimizer, state["model"], state["optimizer"])
    # The schedule built for this run holds its base rates; stepping it onto the saved position sets every group's
    # rate (and get_last_lr) from them. The optimiser has not stepped yet in this process: torch's warning about that
    # order is about skipped schedule values, and none is skipped here.
    scheduler.last_epoch = state["scheduler"]["last_epoch"] - 1
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=re.escape("Detected call of `lr_scheduler.step()`"), category=UserWarning
        )
        scheduler.step()


class Checkpointer:
    """The latest resumable state of one stage's run, kept outside the stage's DVC outputs.

    DVC removes a stage's outputs before re-running it, so checkpoints live under
    ``.alignflow/checkpoints/<stage>/<fingerprint>``; a different config or input
    gets a different fingerprint and starts fresh, with one exception: a run that stopped on a non-finite
    quantity marks its checkpoint, and a rerun that changes only ``RECOVERY_KNOBS`` resumes from it.
    """

    def __init__(self, stage: str, config: dict[str, Any], inputs: list[Path]):
        # How many workers train a run does not change which run a checkpoint continues: it resumes on any number.
        config = {key: value for key, value in config.items() if key != "parallel"}
        self.stage = stage
        self.root = CHECKPOINTS / stage
        self._inputs_digest = content_digest(inputs)  # a model directory can be gigabytes: read it once
        self._locate(stage, config)

    def _locate(self, label: str, config: dict[str, Any]) -> None:
        self.label, self.config = label, config
        self.path = self.root / fingerprint(config, self._inputs_digest) / "latest.pt"
        recovery_config = {key: value for key, value in config.items() if key not in RECOVERY_KNOBS}
        self.recovery_key = fingerprint(recovery_config, self._inputs_digest)

    def part(self, name: str) -> Checkpointer:
        """The checkpointer of ``name``, one of several models a stage trains in turn (an ensemble's members): a
        fingerprint of its own under the stage's, so each resumes apart and ``clear`` removes them all."""
        part = copy.copy(self)
        part._locate(f"{self.stage} {name}", {**self.config, "part": name})
        return part

    def _stopped_runs(self) -> list[Path]:
        """Checkpoints of runs that stopped on a non-finite quantity and differ from this one in knobs only."""
        found = []
        for marker in sorted(self.root.glob(f"*/{DIVERGED}")):
            if json.loads(marker.read_text())["recovery_key"] == self.recovery_key:
                found.append(marker.parent / "latest.pt")
        return [path for path in found if path.is_file()]

    def load(self) -> dict[str, Any] | None:
        """The checkpoint this run resumes from (printing where and from which step), or None to start fresh."""
        candidates = [self.path] if self.path.is_file() else self._stopped_runs()
        if not candidates:
            return None
        checkpoint = torch.load(candidates[0], map_location="cpu", weights_only=False)
        note = "" if candidates[0] == self.path else ", kept when a run with other learning settings stopped"
        print(
            f"{self.label}: resuming from the checkpoint at step {checkpoint['step']} ({candidates[0]}{note})",
            flush=True,
        )
        return checkpoint

    def save(self, state: dict[str, Any]) -> None:
        """Write ``state`` (which holds its ``step``) unless a tensor in it is not finite."""
        require_finite(state, f"{self.label} step {state['step']}, before saving its checkpoint")
        with atomic_output(self.path, with_the_stage=False) as temporary:
            torch.save(state, temporary)

    def keep_for_recovery(self) -> str:
        """Mark this run's checkpoint as one a rerun with a lower learning rate may resume from; say what is kept."""
        if self.path.is_file():
            with atomic_output(self.path.parent / DIVERGED, with_the_stage=False) as temporary:
                temporary.write_text(json.dumps({"recovery_key": self.recovery_key}))
            kept = self.path
        elif not (kept := next(iter(self._stopped_runs()), None)):
            return "no checkpoint had been saved yet"
        step = torch.load(kept, map_location="cpu", weights_only=False)["step"]
        return (
            f"the checkpoint at step {step} is kept ({kept}); a rerun resumes from it, also with a lower "
            f"{' / '.join(RECOVERY_KNOBS)}"
        )

    def clear(self) -> None:
        """Drop the checkpoints once the stage's outputs have landed: until then a rerun resumes from them."""
        after_landing(lambda: shutil.rmtree(self.root, ignore_errors=True))


@contextlib.contextmanager
def stop_on_divergence(checkpointer: Checkpointer) -> Iterator[None]:
    """Around a training loop: a NonFiniteError leaves the last checkpoint marked for recovery and says so."""
    try:
        yield
    except NonFiniteError as error:
        raise NonFiniteError(f"{cause(error)}; {checkpointer.keep_for_recovery()}") from None


def fit(
    stage: str,
    model: torch.nn.Module,
    cfg: OptimizationConfig,
    step_metrics: Callable[[int], dict[str, torch.Tensor]],
    checkpointer: Checkpointer,
    live: Live | None,
    rank: Rank = SINGLE,
    tokens_of: Callable[[int], int] | None = None,
    keep_final: bool = False,
) -> list[tuple[int, dict[str, float]]]:
    """``cfg.max_steps`` AdamW steps on ``step_metrics(step)["loss"]`` with warm-up and cosine decay: the loop every
    fixed-length training stage (SFT, DPO, the reward model) runs. It resumes from ``checkpointer`` bit-for-bit
    (weights, optimiser, schedule, RNG, step, metric history; the data position follows from the step), logs the
    mean of every metric ``step_metrics`` returns over each ``log_every`` steps (with the gradient norm and the
    learning rate), saves a checkpoint every ``save_every`` steps, and stops on a non-finite loss, gradient or
    weight. Returns the history.

    ``keep_final``: save a checkpoint after the last step too, for a stage that trains several models in turn (an
    ensemble) and writes them only once all are trained: resumed after a kill, it finds the finished ones there.

    Data-parallel (``rank`` of a group): ``model`` is the unwrapped model (its state dict is the one-worker run's,
    so a checkpoint resumes with any number of workers) and ``step_metrics`` runs the wrapped one on this rank's
    slice; the metrics logged are means over the ranks, and only rank 0 saves and logs (``live`` None elsewhere;
    None on rank 0 too when the caller logs the history itself).

    ``tokens_of(step)``: the real (unpadded) tokens of step's global batch; with it, rank 0 writes the run's
    throughput and MFU (``write_perf``; the first step, a warm-up, left out).
    """
    optimizer, scheduler = adamw_with_cosine(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps, cfg.max_steps)
    start_step, history, interval = 0, [], {"sums": {}, "steps": 0}
    parameters, throughput = sum(p.numel() for p in model.parameters()), Throughput()
    if (checkpoint := checkpointer.load()) is not None:
        restore_training_state(model, optimizer, scheduler, checkpoint)
        set_rng_state(checkpoint["rng"])
        start_step, history, interval = checkpoint["step"], checkpoint["history"], checkpoint["interval"]
    if live is not None:
        for logged_step, metrics in history:
            log_step(live, logged_step, metrics)
    steps = range(start_step, cfg.max_steps)
    progress = tqdm(steps, desc=stage, initial=start_step, total=cfg.max_steps, disable=not rank.is_main)
    # Rank 0 alone writes checkpoints, so it alone marks one for recovery.
    with stop_on_divergence(checkpointer) if rank.is_main else contextlib.nullcontext():
        for step in progress:
            started = time.perf_counter()
            with autocast(model, cfg.precision):
                metrics = step_metrics(step)
            # Over the ranks: what is logged, and whether to stop (all together, or the others would wait forever
            # in the next all-reduce).
            reported = {name: rank.mean(value) for name, value in metrics.items()}
            if not torch.isfinite(reported["loss"]):
                raise NonFiniteError(f"{stage} step {step + 1}: the loss is {reported['loss'].item()}")
            grad_norm = guarded_step(model, optimizer, metrics["loss"], cfg.grad_clip, f"{stage} step {step + 1}")
            scheduler.step()
            if tokens_of is not None and step > start_step:
                throughput.add(tokens_of(step), time.perf_counter() - started)
            for name, value in reported.items():
                interval["sums"][name] = interval["sums"].get(name, 0.0) + value.item()
            interval["steps"] += 1

            done = step + 1
            if done % cfg.log_every == 0 or done == cfg.max_steps:
                logged = {name: round(total / interval["steps"], 6) for name, total in interval["sums"].items()}
                logged |= {"grad_norm": round(grad_norm.item(), 6), "lr": scheduler.get_last_lr()[0]}
                history.append((done, logged))
                if live is not None:
                    log_step(live, done, logged)
                progress.set_postfix(loss=logged["loss"])
                interval = {"sums": {}, "steps": 0}
            if (done % cfg.save_every == 0 and done < cfg.max_steps) or (keep_final and done == cfg.max_steps):
                weights, moments = training_state(model, optimizer)  # gathered from every rank when sharded
                if rank.is_main:
                    checkpointer.save(
                        {
                            "model": weights,
                            "optimizer": moments,
                            "scheduler": scheduler.state_dict(),
                            "rng": rng_state(),
                            "step": done,
                            "history": history,
                            "interval": interval,
                        }
                    )
        require_finite(model.state_dict(), f"{stage} after step {cfg.max_steps}, before saving the model")
    if live is not None and throughput.seconds:
        write_perf(live, throughput.numbers(parameters, torch.get_num_threads(), rank.world_size))
    return history


def rank_live(stage: str, rank: Rank, into: Path) -> contextlib.AbstractContextManager[Live | None]:
    """``stage_live(stage, into)`` on rank 0, which alone logs; None on the other ranks. ``into``: the metrics'
    temporary directory the stage's process opened, so that they land with its model."""
    return stage_live(stage, into) if rank.is_main else contextlib.nullcontext()


def save_trained(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out: Path, rank: Rank) -> None:
    """Write ``model`` (merged, with its adapter beside it, when it has adapters) and ``tokenizer`` to ``out`` from
    rank 0. Every rank calls it: a sharded model's weights are gathered first, a collective."""
    weights = full_state_dict(model, rank)
    if rank.is_main:
        save_model(model, out, weights)
        tokenizer.save_pretrained(out)
