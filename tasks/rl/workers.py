"""The roles of an RL stage, each a self-contained worker that runs in the stage's process or as a Ray actor
(``tasks/rl/placement.py`` places them; the trainer calls them through ``tasks/rl/role_handles.py``):

- actor: the policy being trained, with its rollout engine (HF or vLLM, synced in place after each update) when
  the engine lives in its process (replicas apart from it: ``tasks/rollout/engine_group.py``);
- critic: per-token values, trained on the returns (only for advantage estimators that need one);
- reference: the frozen initial policy, the KL anchor (only when a KL term or a reference reset is asked for);
- teacher: a frozen teacher that grades the student's tokens (on-policy distillation);
- reward: the frozen reward model(s) and judge (``tasks/rl/reward_role.py``).

Workers exchange token tensors and texts, never models (but for the weights the engines take). The actor's update
is one loop whatever the learner: minibatches, the data-parallel weights, the optimizer step and the engine sync
are its; what a minibatch minimises is the ``ActorLoss`` the learner hands it (``tasks/rl/policy_gradient.py``,
``online_preference.py``, ``distillation.py``).
"""

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import PreTrainedModel

from models import (
    load_critic,
    load_policy,
    load_reference,
    load_tokenizer,
    resolve_device,
)
from models.trainable import (
    adapters_disabled,
    autocast,
    compute_dtype,
    is_adapted,
    merged_state_dict,
    prepared_for_training,
    save_model,
    trainable_policy,
    weights_dtype,
)
from tasks.common.config import Params, RLConfig, engine_in_actor
from tasks.common.distributed import SINGLE, Rank, full_state_dict, shard_in_place, training_state
from tasks.common.training import (
    adamw_with_cosine,
    check_loss,
    clipped_step,
    guarded_step,
    make_deterministic,
    require_finite,
    restore_training_state,
    rng_state,
    set_rng_state,
)
from tasks.data.problems import Example
from tasks.rl.core_algos import clipped_value_loss
from tasks.rl.sequences import PackedBatch, response_logprobs, response_logprobs_and_logits, shared_prompt_logits
from tasks.rollout.engine import Completion, Sampling
from tasks.rollout.engine_group import TaskRollout, make_engine
from tasks.rollout.hf_engine import params_engine


def _minibatches(size: int, minibatch_size: int, epochs: int) -> list[torch.Tensor]:
    """Row indices of every minibatch of ``epochs`` shuffled passes (torch's seeded generator)."""
    return [rows for _ in range(epochs) for rows in torch.randperm(size).split(minibatch_size)]


Metrics = dict[str, tuple[torch.Tensor, float]]  # name: (value, its weight in the average over the ranks)


@dataclass(frozen=True)
class Minibatch:
    """A rank's share of a minibatch, on the policy's device, as an ``ActorLoss`` reads it."""

    part: PackedBatch
    logprobs: torch.Tensor  # (B', T) the policy's log-probs of the response tokens, with their gradients
    logits: torch.Tensor  # (B', T, V) at the rollout temperature
    old_logprobs: torch.Tensor  # (B', T) π_old's
    inputs: dict[str, torch.Tensor]  # the learner's per-row tensors (advantages, the reference's log-probs, ...)
    # weights making a loss averaged over items (responses, or pairs), or over tokens, summed over the micro-batches
    # and averaged over the ranks, the whole minibatch's (alone and whole: 1.0, and multiplying by it changes no bit)
    per_item: float
    per_token: float

    @property
    def mask(self) -> torch.Tensor:
        return self.part.response_mask


@dataclass(frozen=True)
class ActorLoss:
    """What the actor's update minimises, handed to it by a learner: ``compute(minibatch, cfg)`` is the
    minibatch's loss, weighted for this rank, and its metrics."""

    compute: Callable[[Minibatch, RLConfig], tuple[torch.Tensor, Metrics]]
    # The rows one loss term reads: 2 for a preference pair, whose chosen response is row i of a batch of 2P rows
    # and rejected one row i + P; a minibatch takes minibatch_size rows' worth of items.
    rows_per_item: int = 1
    reads_old_logprobs: bool = True  # reads π_old: without them, the update must be a single step (``update``)


class _TrainedRole:
    """A role with a model, an optimizer and a schedule, on one rank of its data-parallel group (alone: the only
    one): its resumable state, in one process's format (so a run resumes on any number of workers)."""

    model: PreTrainedModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    rank: Rank

    def _build(self, model: PreTrainedModel, lr: float, cfg: RLConfig, rank: Rank) -> None:
        self.rank, self.model = rank, model
        self.model.train()
        if rank.world_size > 1 and cfg.parallel.strategy == "fsdp":
            shard_in_place(self.model)
        self.optimizer, self.scheduler = _optimizer(self.model, lr, cfg)

    def state(self) -> dict[str, Any] | None:
        """Rank 0's (None elsewhere): every rank calls it, as a sharded model's state is gathered."""
        weights, moments = training_state(self.model, self.optimizer)
        if not self.rank.is_main:
            return None
        return {"model": weights, "optimizer": moments, "scheduler": self.scheduler.state_dict(), "rng": rng_state()}

    def load_state(self, state: dict[str, Any]) -> None:
        restore_training_state(self.model, self.optimizer, self.scheduler, state)
        set_rng_state(state["rng"])

    def _weights(self) -> dict[str, torch.Tensor] | None:
        """The whole model's weights on rank 0, None elsewhere (every rank calls it: gathering is a collective)."""
        gathered = full_state_dict(self.model, self.rank)
        if not self.rank.is_main:
            return None
        state = gathered if gathered is not None else self.model.state_dict()
        return {name: tensor.detach().cpu().clone() for name, tensor in state.items()}

    def _step(self, loss: torch.Tensor, cfg: RLConfig, where: str) -> torch.Tensor:
        return guarded_step(self.model, self.optimizer, loss, cfg.grad_clip, where, self.rank)

    def _over_ranks(self, totals: dict[str, float]) -> dict[str, float]:
        """Metrics each rank summed with its shares' weights, averaged over the ranks: the minibatches' own."""
        if self.rank.world_size == 1:
            return totals
        averaged = self.rank.mean(torch.tensor(list(totals.values()), dtype=torch.float64))
        return dict(zip(totals, averaged.tolist(), strict=True))

    def _rows_pass(self, batch: PackedBatch, pass_rows) -> torch.Tensor:
        """``pass_rows(part)`` (B', T) on this rank's share of ``batch``'s rows, gathered into (B, T) on every
        rank (each rank fills its rows of a tensor of zeros; their sum is the whole)."""
        if self.rank.world_size == 1:
            return pass_rows(batch)
        mine, weight = self.rank.share(torch.arange(len(batch.response_mask)))
        whole = torch.zeros_like(batch.response_mask)
        values = pass_rows(batch.select(mine))
        if weight:
            whole[mine] = values
        return self.rank.sum(whole)


def item_rows(items: torch.Tensor, count: int, rows_per_item: int) -> torch.Tensor:
    """The rows of ``items`` of a batch of ``count`` items, each ``rows_per_item`` rows ``count`` apart."""
    return torch.cat([items + offset * count for offset in range(rows_per_item)])


def shares(
    rank: Rank, items: torch.Tensor, mask: torch.Tensor, rows_per_item: int = 1
) -> tuple[torch.Tensor, float, float]:
    """This rank's share of a minibatch's ``items`` as rows (``item_rows``; ``mask`` (B, T) marks every row's
    tokens), and the weights of a loss averaged over its items (responses, or pairs of them) and of one averaged
    over its tokens: weighted so, and averaged over the ranks, each is the whole minibatch's loss (``Rank.share``)."""
    mine, weight = rank.share(items)
    count = len(mask) // rows_per_item
    rows = item_rows(mine, count, rows_per_item)
    if rank.world_size == 1:
        return rows, 1.0, 1.0
    every = item_rows(items, count, rows_per_item)
    tokens = weight and rank.world_size * mask[rows].sum().item() / mask[every].sum().clamp(min=1).item()
    return rows, weight, tokens


def micro_shares(
    rank: Rank, items: torch.Tensor, mask: torch.Tensor, rows_per_item: int, micro_batch_size: int | None
) -> list[tuple[torch.Tensor, float, float]]:
    """``shares`` cut into micro-batches of at most ``micro_batch_size`` rows (None: one, the share): each one's
    rows and weights, so that its losses, summed over the micro-batches (and averaged over the ranks), are the whole
    minibatch's. Every rank cuts as many, as its backward passes may be collectives (FSDP); a part left empty runs
    its share's first item with weight 0."""
    rows, per_item, per_token = shares(rank, items, mask, rows_per_item)
    if micro_batch_size is None:
        return [(rows, per_item, per_token)]
    mine, _ = rank.share(items)
    count = len(mask) // rows_per_item
    largest = -(-len(items) // rank.world_size)
    parts = mine.tensor_split(-(-largest // max(1, micro_batch_size // rows_per_item)))
    tokens = mask[rows].sum().clamp(min=1).item()
    cut = []
    for part in parts:
        if len(part):
            part_rows = item_rows(part, count, rows_per_item)
            cut.append((part_rows, per_item * len(part) / len(mine), per_token * mask[part_rows].sum().item() / tokens))
        else:
            cut.append((item_rows(mine[:1], count, rows_per_item), 0.0, 0.0))
    return cut


def _optimizer(model: torch.nn.Module, lr: float, cfg: RLConfig) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW with warm-up, then a constant rate or (``lr_schedule: cosine``) decay to 0 at the last iteration."""
    return adamw_with_cosine(model, lr, 0.0, cfg.warmup_steps, cfg.steps if cfg.lr_schedule == "cosine" else None)


class ActorWorker(_TrainedRole):
    """The policy, and, when it lives in this process (``engine_in_actor``), the rollout engine that samples from
    it: from the policy itself (``sync_every: 1``) or from a copy of it (``sampler``) refreshed every
    ``sync_every`` updates: semi-online, or an adapted policy, whose copy has the adapters merged into its weights
    in the compute dtype (PEFT's unmerged layers made a sampling step of SmolLM2 on a GPU 2.2x as long:
    docs/speed.md). Engines apart from the actor take ``weights_for_engines`` on the same schedule."""

    def __init__(self, params: Params, cfg: RLConfig, model_dir: Path, rank: Rank = SINGLE):
        self.cfg = cfg
        make_deterministic(params.seed)
        self._build(trainable_policy(model_dir, resolve_device(params.device), cfg), cfg.actor_lr, cfg, rank)
        self.updates, self.synced_at = 0, 0  # optimizer steps taken, and at which the engine was last synced
        self.sync_due = False  # engines apart from the actor are behind it by sync_every steps or more
        self.tokenizer = load_tokenizer(model_dir)
        # samples of the policy as it is now (held-out evaluation during training)
        self.current = params_engine(params, self.model, self.tokenizer)
        self.sampler, self.engine = None, None
        if engine_in_actor(cfg):
            self.sampler = self._sampler(model_dir)
            self.engine = make_engine(params, cfg, self.sampler, self.tokenizer, model_dir, params.seed)
            self.rollout = TaskRollout.of(params, cfg, model_dir)

    def _sampler(self, model_dir: Path) -> PreTrainedModel:
        if is_adapted(self.model):
            sampler = load_policy(model_dir, self.model.device, compute_dtype(self.cfg.precision))
            sampler.load_state_dict(merged_state_dict(self.model))
            return sampler.requires_grad_(False)
        return self.model if self.cfg.sync_every == 1 else copy.deepcopy(self.model).requires_grad_(False)

    def sample(self, examples: list[Example]) -> list[Completion]:
        """A rollout of ``examples`` (``TaskRollout``), from the engine in this process."""
        # in the compute dtype, as the engines apart from the actor and the update's passes compute
        with autocast(self.sampler, self.cfg.precision):
            return self.rollout.sample(self.engine, examples)

    def sample_current(self, prompts: list[str], sampling: Sampling, seed: int) -> list[Completion]:
        """Samples of the policy as it is now (a semi-online engine may lag it), for held-out evaluation, drawn
        from ``seed`` without touching the random state training draws from."""
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), autocast(self.model, self.cfg.precision):
            torch.manual_seed(seed)
            return self.current.generate(prompts, sampling)

    def _took_steps(self, steps: int) -> None:
        """Count ``steps`` optimizer steps and sync the engine once ``sync_every`` have passed since the last sync
        (engines apart from the actor: mark the sync due, for ``weights_for_engines``)."""
        self.updates += steps
        if self.updates - self.synced_at >= self.cfg.sync_every:
            self.synced_at = self.updates
            if self.engine is None:
                self.sync_due = True
                return
            if self.sampler is not self.model:
                self.sampler.load_state_dict(merged_state_dict(self.model))
            self.engine.sync_weights(self.sampler)

    def weights_for_engines(self) -> dict[str, torch.Tensor] | None:
        """The policy's weights (adapters merged in) when the engines apart from it are due a sync (rank 0's), else
        None."""
        due, self.sync_due = self.sync_due, False
        if not due:
            return None
        if is_adapted(self.model):
            return {name: tensor.cpu().clone() for name, tensor in merged_state_dict(self.model).items()}
        return self._weights()

    @torch.no_grad()
    def logprobs(self, batch: PackedBatch) -> torch.Tensor:
        def pass_rows(part: PackedBatch) -> torch.Tensor:
            with autocast(self.model, self.cfg.precision):
                return response_logprobs(self.model, part.to(self.model.device), self.cfg.temperature).cpu()

        return self._rows_pass(batch, pass_rows)

    @torch.no_grad()
    def reference_logprobs(self, batch: PackedBatch) -> torch.Tensor:
        """The reference's log-probs when the policy trains through adapters: its own base, adapters disabled."""
        with adapters_disabled(self.model):
            return self.logprobs(batch)

    def update(
        self,
        batch: PackedBatch,
        loss: ActorLoss,
        rows: dict[str, torch.Tensor | None],
        old_logprobs: torch.Tensor | None = None,
    ) -> tuple[dict[str, float], torch.Tensor]:
        """``epochs`` passes of minibatch steps on ``loss`` over ``batch`` (``rows``: the loss's per-row tensors,
        (B, ...) each, None for one it goes without), then an engine sync when one is due. Returns the metrics,
        averaged over the minibatches, and π_old's log-probs (B, T).

        ``old_logprobs`` None: a row's π_old is its log-probs at the first step that reads it (that step's own
        forward pass, detached; no separate pass), which is the policy that sampled it when there is one step."""
        cfg, device = self.cfg, self.model.device
        items = len(batch.response_mask) // loss.rows_per_item
        minibatches = _minibatches(items, max(1, cfg.minibatch_size // loss.rows_per_item), cfg.epochs)
        if old_logprobs is None and loss.reads_old_logprobs and len(minibatches) > 1:
            raise ValueError(f"{len(minibatches)} updates per rollout need the old log-probs computed before them")
        before = torch.zeros_like(batch.response_mask)
        seen = torch.zeros(len(before), dtype=torch.bool)
        totals: dict[str, float] = {}
        for minibatch in minibatches:
            self.optimizer.zero_grad(set_to_none=True)
            summed = torch.zeros((), dtype=torch.float64)
            # this rank's rows by micro-batch, and the weights that make their losses' sum, averaged over the ranks,
            # the minibatch's
            cut = micro_shares(self.rank, minibatch, batch.response_mask, loss.rows_per_item, cfg.micro_batch_size)
            for mine, per_item, per_token in cut:
                part = batch.select(mine).to(device)
                with autocast(self.model, cfg.precision):
                    logprobs, logits = response_logprobs_and_logits(self.model, part, cfg.temperature)
                if old_logprobs is None and per_item:  # a part of weight 0 leaves its rows to the one that has them
                    fresh = ~seen[mine]
                    before[mine[fresh]] = logprobs.detach().cpu()[fresh]
                old = (before if old_logprobs is None else old_logprobs)[mine].to(device)
                inputs = {name: tensor[mine].to(device) for name, tensor in rows.items() if tensor is not None}
                value, metrics = loss.compute(Minibatch(part, logprobs, logits, old, inputs, per_item, per_token), cfg)
                value.backward()
                summed += value.detach().double().cpu()
                for name, (metric, weight) in metrics.items():
                    totals[name] = totals.get(name, 0.0) + metric.item() * weight / len(minibatches)
            if old_logprobs is None:
                seen[item_rows(minibatch, items, loss.rows_per_item)] = True
            check_loss(self.optimizer, summed, "the actor's update", self.rank)
            grad_norm = clipped_step(self.model, self.optimizer, cfg.grad_clip, "the actor's update", self.rank)
            totals["grad_norm"] = totals.get("grad_norm", 0.0) + grad_norm.item() / len(minibatches)
        self.scheduler.step()
        self._took_steps(len(minibatches))
        return self._over_ranks(totals), old_logprobs if old_logprobs is not None else self.rank.sum(before)

    def weights(self) -> dict[str, torch.Tensor] | None:
        return self._weights()

    def restore(self, weights: dict[str, torch.Tensor]) -> None:
        """Make ``weights`` (``weights()``'s, from an earlier iteration) the policy's: the guard's kept iteration,
        before ``save``."""
        self.model.load_state_dict(weights)

    def state(self) -> dict[str, Any] | None:
        state = super().state()
        if state is None:
            return None
        # the engine's lagging copy, semi-online in this process (engines apart from it keep their own); an
        # up-to-date one is the policy's merged weights, made again on loading
        lagging = self.sampler not in (None, self.model) and self.cfg.sync_every > 1
        sampler = self.sampler.state_dict() if lagging else None
        return state | {"sampler": sampler, "updates": self.updates, "synced_at": self.synced_at}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.updates, self.synced_at = state["updates"], state["synced_at"]
        if self.engine is not None:
            if state["sampler"] is not None:
                self.sampler.load_state_dict(state["sampler"])
            elif self.sampler is not self.model:
                self.sampler.load_state_dict(merged_state_dict(self.model))
            self.engine.sync_weights(self.sampler)

    def save(self, out: Path, tokenizer_dir: Path) -> None:
        """Rank 0 writes the policy (every rank calls it: a sharded one is gathered first)."""
        weights = self._weights()
        if not self.rank.is_main:
            return
        require_finite(weights, "the policy, before saving it")
        save_model(self.model, out, weights)
        load_tokenizer(tokenizer_dir).save_pretrained(out)


class CriticWorker(_TrainedRole):
    def __init__(self, params: Params, cfg: RLConfig, model_dir: Path, rank: Rank = SINGLE):
        self.cfg = cfg
        make_deterministic(params.seed + 1)
        # trained as the actor is: in its precision, through adapters of its rank (the value head whole)
        critic = load_critic(model_dir, resolve_device(params.device), weights_dtype(cfg.precision))
        self._build(prepared_for_training(critic, cfg), cfg.critic_lr, cfg, rank)

    def _values(self, batch: PackedBatch) -> torch.Tensor:
        with autocast(self.model, self.cfg.precision):
            logits = self.model(**batch.model_inputs()).logits
        return batch.response_logits(logits).squeeze(-1).float()

    @torch.no_grad()
    def values(self, batch: PackedBatch) -> torch.Tensor:
        return self._rows_pass(batch, lambda part: self._values(part.to(self.model.device)).cpu())

    def update(self, batch: PackedBatch, old_values: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
        cfg, device = self.cfg, self.model.device
        minibatches = _minibatches(len(old_values), cfg.minibatch_size, cfg.epochs)
        total = 0.0
        for minibatch in minibatches:
            rows, _, per_token = shares(self.rank, minibatch, batch.response_mask)
            part = batch.select(rows).to(device)
            loss = clipped_value_loss(
                self._values(part),
                old_values[rows].to(device),
                returns[rows].to(device),
                part.response_mask,
                cfg.value_clip,
            )
            self._step(per_token * loss, cfg, "the critic's update")
            total += loss.item() * per_token / len(minibatches)
        self.scheduler.step()
        return self._over_ranks({"value_loss": total})


class FrozenWorker:
    """A frozen policy: the reference (the KL anchor) or a distillation teacher."""

    def __init__(self, params: Params, cfg: RLConfig, model_dir: Path):
        self.temperature = cfg.temperature
        self.model = load_reference(model_dir, resolve_device(params.device), compute_dtype(cfg.precision))
        self.vocabulary = len(load_tokenizer(model_dir))  # a checkpoint's embedding rows may pad the vocabulary

    @torch.no_grad()
    def logprobs(self, batch: PackedBatch) -> torch.Tensor:
        return response_logprobs(self.model, batch.to(self.model.device), self.temperature).cpu()

    @torch.no_grad()
    def logits(self, batch: PackedBatch) -> torch.Tensor:
        """(B, T, V): the next-token logits at every response position, at the temperature, over the tokenizer's
        vocabulary (what a divergence over the full vocabulary compares)."""
        logits = shared_prompt_logits(self.model, batch.to(self.model.device))[..., : self.vocabulary]
        return (logits.float() / self.temperature).cpu()

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: tensor.cpu() for name, tensor in self.model.state_dict().items()}

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Make the current policy the new anchor (a reference reset)."""
        self.model.load_state_dict(weights)
