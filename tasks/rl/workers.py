"""The roles of an RL stage, each a self-contained worker that runs in the stage's process or as a Ray actor.

- actor: the policy being trained, with its rollout engine (HF or vLLM, synced in place after each update) when
  the engine lives in its process;
- rollout: engine replicas apart from the actor (``rollout_engines`` > 1, or a data-parallel actor), each with a
  copy of the policy, sampling its share of the prompts, taking the actor's weights after an update;
- critic: per-token values, trained on the returns (only for advantage estimators that need one);
- reference: the frozen initial policy, the KL anchor (only when a KL term or a reference reset is asked for);
- teacher: a frozen teacher that grades the student's tokens (on-policy distillation);
- reward: the frozen reward model(s), scoring (prompt, response) texts; an ensemble is combined by mean or min.

Workers exchange token tensors and texts, never models (but for the weights the engines take). ``place`` puts a
role in this process (``colocate``), on its own Ray actor with the resources ``roles`` gives it, or, for the
trained roles with ``parallel.num_workers`` > 1, on a group of data-parallel Ray workers (``RoleGroup``: every
rank runs every call, each on its share of the rows, gradients averaged over the ranks); the trainer calls all
of them the same way and may run calls on different roles concurrently.
"""

import contextlib
import copy
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import PreTrainedModel

from models import load_critic, load_policy, load_reference, load_reward_model, load_tokenizer, resolve_device
from tasks.common.config import Params, RLConfig, StageResources
from tasks.common.distributed import SINGLE, Rank, RoleGroup, full_state_dict, shard_in_place, training_state
from tasks.common.training import (
    adamw_with_cosine,
    guarded_step,
    make_deterministic,
    require_finite,
    restore_training_state,
    rng_state,
    set_rng_state,
)
from tasks.rl.core_algos import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    clipped_value_loss,
    entropy_from_logits,
    masked_mean,
)
from tasks.rl.distill_losses import DISTILL_LOSSES
from tasks.rl.preference_losses import PairLogprobs, preference_loss, sequence_logprobs
from tasks.rl.sequences import PackedBatch, response_logprobs, score_texts, shared_prompt_logits
from tasks.rollout.engine import Completion, RolloutEngine, Sampling
from tasks.rollout.hf_engine import HFEngine


def _minibatches(size: int, minibatch_size: int, epochs: int) -> list[torch.Tensor]:
    """Row indices of every minibatch of ``epochs`` shuffled passes (torch's seeded generator)."""
    return [rows for _ in range(epochs) for rows in torch.randperm(size).split(minibatch_size)]


def updates_per_rollout(rows: int, cfg: RLConfig) -> int:
    """How many optimizer steps the actor takes on a rollout of ``rows`` responses: one per minibatch."""
    return cfg.epochs * math.ceil(rows / cfg.minibatch_size)


def engine_in_actor(cfg: RLConfig) -> bool:
    """Whether the rollout engine lives in the actor's process (one engine, one actor worker)."""
    return cfg.rollout_engines == 1 and cfg.parallel.num_workers == 1


def _rollout_sampling(cfg: RLConfig) -> Sampling:
    return Sampling(cfg.max_new_tokens, n=cfg.group_size, temperature=cfg.temperature)


def _make_engine(
    params: Params, cfg: RLConfig, model: PreTrainedModel, tokenizer, model_dir: Path, seed: int
) -> RolloutEngine:
    if cfg.rollout_backend == "vllm":
        from tasks.rollout.vllm_engine import VLLMEngine  # vllm is optional: imported only when asked for

        engine = VLLMEngine(model_dir, seed=seed, max_model_len=model.config.max_position_embeddings)
        engine.sync_weights(model)
        return engine
    return HFEngine(model, tokenizer, params.eval.batch_size)


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


def shares(rank: Rank, rows: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """This rank's share of a minibatch's ``rows``, and the weights of a loss averaged over its responses and of
    one averaged over its tokens (``mask`` (B, T) marks every row's): weighted so, and averaged over the ranks,
    each is the whole minibatch's loss (``Rank.share``)."""
    mine, weight = rank.share(rows)
    if rank.world_size == 1:
        return mine, 1.0, 1.0
    tokens = weight and rank.world_size * mask[mine].sum().item() / mask[rows].sum().clamp(min=1).item()
    return mine, weight, tokens


def _optimizer(model: torch.nn.Module, lr: float, cfg: RLConfig) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW with warm-up, then a constant rate or (``lr_schedule: cosine``) decay to 0 at the last iteration."""
    return adamw_with_cosine(model, lr, 0.0, cfg.warmup_steps, cfg.steps if cfg.lr_schedule == "cosine" else None)


class ActorWorker(_TrainedRole):
    """The policy, and, when it lives in this process (``engine_in_actor``), the rollout engine that samples from
    it: from the policy itself (``sync_every: 1``) or, semi-online, from a copy of it (``sampler``) refreshed every
    ``sync_every`` updates. Engines apart from the actor take ``weights_for_engines`` on the same schedule."""

    def __init__(self, params: Params, cfg: RLConfig, model_dir: Path, rank: Rank = SINGLE):
        self.cfg = cfg
        make_deterministic(params.seed)
        self._build(load_policy(model_dir, resolve_device(params.device)), cfg.actor_lr, cfg, rank)
        self.updates, self.synced_at = 0, 0  # optimizer steps taken, and at which the engine was last synced
        self.sync_due = False  # engines apart from the actor are behind it by sync_every steps or more
        self.tokenizer, self.batch_size = load_tokenizer(model_dir), params.eval.batch_size
        self.sampler, self.engine = None, None
        if engine_in_actor(cfg):
            self.sampler = self.model if cfg.sync_every == 1 else copy.deepcopy(self.model).requires_grad_(False)
            self.engine = _make_engine(params, cfg, self.sampler, self.tokenizer, model_dir, params.seed)

    def generate(self, prompts: list[str]) -> list[Completion]:
        return self.engine.generate(prompts, _rollout_sampling(self.cfg))

    def sample_current(self, prompts: list[str], sampling: Sampling, seed: int) -> list[Completion]:
        """Samples of the policy as it is now (a semi-online engine may lag it), for held-out evaluation, drawn
        from ``seed`` without touching the random state training draws from."""
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return HFEngine(self.model, self.tokenizer, self.batch_size).generate(prompts, sampling)

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
                self.sampler.load_state_dict(self.model.state_dict())
            self.engine.sync_weights(self.sampler)

    def weights_for_engines(self) -> dict[str, torch.Tensor] | None:
        """The policy's weights when the engines apart from it are due a sync (rank 0's), else None."""
        due, self.sync_due = self.sync_due, False
        return self._weights() if due else None

    @torch.no_grad()
    def logprobs(self, batch: PackedBatch) -> torch.Tensor:
        def pass_rows(part: PackedBatch) -> torch.Tensor:
            return response_logprobs(self.model, part.to(self.model.device), self.cfg.temperature)[0].cpu()

        return self._rows_pass(batch, pass_rows)

    def update(
        self,
        batch: PackedBatch,
        old_logprobs: torch.Tensor | None,
        advantages: torch.Tensor,
        ref_logprobs: torch.Tensor | None,
        kl_coef: float,
        teacher_logits: torch.Tensor | None = None,
    ) -> tuple[dict[str, float], torch.Tensor]:
        """``epochs`` passes of minibatch steps on the policy loss (minus the entropy bonus, plus the KL loss
        when one is asked for, plus the distillation divergence ``cfg.distill_loss`` to ``teacher_logits`` (B, T, V)
        when they are given), then an engine sync. Returns the metrics and π_old's log-probs (B, T).

        ``old_logprobs`` None means a single update: π_old is then the policy about to take it, whose
        log-probs are the update's own forward pass, detached (no separate pass for them)."""
        cfg, device = self.cfg, self.model.device
        policy_loss_fn = POLICY_LOSSES[cfg.policy_loss]
        kl_estimator = KL_ESTIMATORS.get(cfg.kl_loss)
        totals = {"policy_loss": 0.0, "clip_fraction": 0.0, "entropy": 0.0, "approx_kl": 0.0, "grad_norm": 0.0}
        if teacher_logits is not None:
            totals["divergence"] = 0.0
        minibatches = _minibatches(len(advantages), cfg.minibatch_size, cfg.epochs)
        if old_logprobs is None and len(minibatches) > 1:
            raise ValueError(f"{len(minibatches)} updates per rollout need the old log-probs computed before them")
        from_update = old_logprobs is None
        old_logprobs = torch.zeros_like(advantages) if from_update else old_logprobs
        for minibatch in minibatches:
            # this rank's rows, and the weights that make its losses' average over the ranks the minibatch's
            rows, per_sequence, per_token = shares(self.rank, minibatch, batch.response_mask)
            loss_weight = per_token if policy_loss_fn.per == "tokens" else per_sequence
            part = batch.select(rows).to(device)
            logprobs, logits = response_logprobs(self.model, part, cfg.temperature)
            mask = part.response_mask
            if from_update and per_sequence:
                old_logprobs[rows] = logprobs.detach().cpu()
            old = old_logprobs[rows].to(device)
            policy_loss, clip_fraction = policy_loss_fn(
                logprobs,
                old,
                advantages[rows].to(device),
                mask,
                eps_low=cfg.clip_low,
                eps_high=cfg.clip_high,
                max_length=cfg.max_new_tokens,
            )
            with torch.set_grad_enabled(cfg.entropy_coef != 0):  # a metric only, unless it is in the loss
                entropy = masked_mean(entropy_from_logits(logits), mask)
            # (alone, every weight is 1.0, and multiplying by it changes no bit)
            loss = loss_weight * policy_loss - per_token * cfg.entropy_coef * entropy
            if kl_estimator is not None:
                kl = masked_mean(kl_estimator(logprobs, ref_logprobs[rows].to(device)), mask)
                loss = loss + per_token * (kl_coef * kl)
            if teacher_logits is not None:
                teacher = teacher_logits[rows].to(device)
                student = logits[..., : teacher.shape[-1]]
                divergence = masked_mean(DISTILL_LOSSES[cfg.distill_loss](student, teacher, mask, beta=cfg.jsd_beta), mask)
                loss = loss + per_token * divergence
                totals["divergence"] += divergence.item() * per_token / len(minibatches)
            grad_norm = self._step(loss, cfg, "the actor's update")
            with torch.no_grad():
                # k3 estimate of KL(π_old ‖ π_θ) on the sampled tokens: how far this update moved the policy
                log_ratio = torch.where(mask.bool(), old - logprobs, 0)
                approx_kl = masked_mean(torch.expm1(log_ratio) - log_ratio, mask)
            weighted = (
                ("policy_loss", policy_loss, loss_weight),
                ("clip_fraction", clip_fraction, per_token),
                ("entropy", entropy, per_token),
                ("approx_kl", approx_kl, per_token),
                ("grad_norm", grad_norm, 1.0),  # the same on every rank
            )
            for name, value, weight in weighted:
                totals[name] += value.item() * weight / len(minibatches)
        self.scheduler.step()
        self._took_steps(len(minibatches))
        if from_update:
            old_logprobs = self.rank.sum(old_logprobs)
        return self._over_ranks(totals), old_logprobs

    def preference_update(
        self, batch: PackedBatch, ref_logprobs: torch.Tensor | None
    ) -> tuple[dict[str, float], torch.Tensor]:
        """``epochs`` passes of minibatch steps on the preference loss ``cfg.preference_loss`` over the P pairs of ``batch``
        (rows 0..P-1 chosen, P..2P-1 rejected; ``minibatch_size`` responses, half as many pairs, per step).
        Returns the metrics and each row's log-probs before the first step on it (B, T)."""
        cfg, device = self.cfg, self.model.device
        num_pairs = len(batch.input_ids) // 2
        minibatches = _minibatches(num_pairs, max(1, cfg.minibatch_size // 2), cfg.epochs)
        before = torch.zeros_like(batch.response_mask)
        seen = torch.zeros(len(before), dtype=torch.bool)
        names = ("preference_loss", "pair_accuracy", "margin", "chosen_logp", "rejected_logp", "entropy", "grad_norm")
        totals = dict.fromkeys(names, 0.0)
        for minibatch in minibatches:
            pair_rows, weight = self.rank.share(minibatch)  # a loss averaged over pairs: weighted by its share
            rows = torch.cat([pair_rows, pair_rows + num_pairs])
            part = batch.select(rows).to(device)
            logprobs, logits = response_logprobs(self.model, part, cfg.temperature)
            fresh = ~seen[rows]
            if weight:
                before[rows[fresh]] = logprobs.detach().cpu()[fresh]
            seen[torch.cat([minibatch, minibatch + num_pairs])] = True
            sums, lengths = sequence_logprobs(logprobs, part.response_mask)
            reference = (None, None)
            if ref_logprobs is not None:
                reference = sequence_logprobs(ref_logprobs[rows].to(device), part.response_mask)[0].chunk(2)
            pairs = PairLogprobs(*sums.chunk(2), *lengths.chunk(2), *reference)
            losses, chosen, rejected = preference_loss(
                cfg.preference_loss, pairs, cfg.beta, cfg.label_smoothing, cfg.simpo_gamma, cfg.sft_weight
            )
            with torch.no_grad():
                entropy = masked_mean(entropy_from_logits(logits), part.response_mask)
            grad_norm = self._step(weight * losses.mean(), cfg, "the actor's update")
            values = (
                losses.mean(),
                (chosen > rejected).float().mean(),
                (chosen - rejected).mean(),
                pairs.chosen.mean(),
                pairs.rejected.mean(),
                entropy,
            )
            for name, value in zip(names, values, strict=False):
                totals[name] += value.item() * weight / len(minibatches)
            totals["grad_norm"] += grad_norm.item() / len(minibatches)  # the same on every rank
        self.scheduler.step()
        self._took_steps(len(minibatches))
        return self._over_ranks(totals), self.rank.sum(before)

    def weights(self) -> dict[str, torch.Tensor] | None:
        return self._weights()

    def state(self) -> dict[str, Any] | None:
        state = super().state()
        if state is None:
            return None
        # the engine's lagging copy, semi-online in this process (engines apart from it keep their own)
        sampler = self.sampler.state_dict() if self.sampler not in (None, self.model) else None
        return state | {"sampler": sampler, "updates": self.updates, "synced_at": self.synced_at}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.updates, self.synced_at = state["updates"], state["synced_at"]
        if self.engine is not None:
            if state["sampler"] is not None:
                self.sampler.load_state_dict(state["sampler"])
            self.engine.sync_weights(self.sampler)

    def save(self, out: Path, tokenizer_dir: Path) -> None:
        """Rank 0 writes the policy (every rank calls it: a sharded one is gathered first)."""
        weights = self._weights()
        if not self.rank.is_main:
            return
        require_finite(weights, "the policy, before saving it")
        self.model.save_pretrained(out, state_dict=weights)
        load_tokenizer(tokenizer_dir).save_pretrained(out)


class CriticWorker(_TrainedRole):
    def __init__(self, params: Params, cfg: RLConfig, model_dir: Path, rank: Rank = SINGLE):
        self.cfg = cfg
        make_deterministic(params.seed + 1)
        self._build(load_critic(model_dir, resolve_device(params.device)), cfg.critic_lr, cfg, rank)

    def _values(self, batch: PackedBatch) -> torch.Tensor:
        return batch.response_logits(self.model(**batch.model_inputs()).logits).squeeze(-1).float()

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
        self.model = load_reference(model_dir, resolve_device(params.device))
        self.vocabulary = len(load_tokenizer(model_dir))  # a checkpoint's embedding rows may pad the vocabulary

    @torch.no_grad()
    def logprobs(self, batch: PackedBatch) -> torch.Tensor:
        return response_logprobs(self.model, batch.to(self.model.device), self.temperature)[0].cpu()

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


class RewardWorker:
    def __init__(self, params: Params, cfg: RLConfig, member_dirs: list[Path]):
        device = resolve_device(params.device)
        self.members = [(load_reward_model(path, device), load_tokenizer(path)) for path in member_dirs]
        self.combine, self.batch_size = cfg.reward_ensemble, params.eval.batch_size

    def score(self, prompts: list[str], responses: list[str]) -> torch.Tensor:
        scores = torch.stack(
            [score_texts(model, tokenizer, prompts, responses, self.batch_size) for model, tokenizer in self.members]
        )
        return scores.mean(0) if self.combine == "mean" else scores.min(0).values

    def weights(self) -> dict[str, torch.Tensor]:
        return {
            f"{index}.{name}": tensor.cpu()
            for index, (model, _) in enumerate(self.members)
            for name, tensor in model.state_dict().items()
        }


# Seeds of the engine replicas, apart from the actor's (params.seed) and the critic's (params.seed + 1)
ENGINE_SEED_OFFSET = 1000


class EngineWorker:
    """One rollout engine replica apart from the actor: a copy of the policy and its engine (HF or vLLM), which
    samples the share of the prompts it is given and takes the actor's weights when a sync is due."""

    def __init__(self, params: Params, cfg: RLConfig, model_dir: Path, replica: int):
        self.cfg = cfg
        make_deterministic(params.seed + ENGINE_SEED_OFFSET + replica)  # each replica samples from its own stream
        self.model = load_policy(model_dir, resolve_device(params.device)).requires_grad_(False)
        self.model.eval()
        tokenizer = load_tokenizer(model_dir)
        self.engine = _make_engine(
            params, cfg, self.model, tokenizer, model_dir, params.seed + ENGINE_SEED_OFFSET + replica
        )

    def generate(self, prompts: list[str]) -> list[Completion]:
        return self.engine.generate(prompts, _rollout_sampling(self.cfg))

    def load_weights(self, weights: dict[str, torch.Tensor] | None) -> None:
        """Sample from ``weights`` from now on (None: no sync was due; keep sampling as before)."""
        if weights is not None:
            self.model.load_state_dict(weights)
            self.engine.sync_weights(self.model)

    def state(self) -> dict[str, Any]:
        """Its random state, and semi-online its weights (which lag the actor's): what a resumed run needs."""
        weights = None
        if self.cfg.sync_every > 1:
            weights = {name: tensor.detach().cpu().clone() for name, tensor in self.model.state_dict().items()}
        return {"rng": rng_state(), "weights": weights}

    def load_state(self, state: dict[str, Any]) -> None:
        set_rng_state(state["rng"])
        self.load_weights(state["weights"])


class Pending:
    """A call's result: already computed (colocated) or a Ray object to fetch."""

    def __init__(self, value: Any, remote: bool):
        self.value, self.remote = value, remote

    def result(self) -> Any:
        return ray.get(self.value) if self.remote else self.value

    def ref(self) -> Any:
        """The result as it is, to hand to another role: a Ray object stays unfetched."""
        return self.value


class Worker:
    """One role, in this process or on a Ray actor; ``call`` returns a Pending either way."""

    def __init__(self, role: type, args: tuple, resources: StageResources | None):
        if resources is None:
            self.handle, self.remote = role(*args), False
        else:
            actor = ray.remote(role).options(
                num_cpus=resources.num_cpus,
                num_gpus=resources.num_gpus,
                memory=int(resources.memory_gb * 2**30) or None,
            )
            self.handle, self.remote = actor.remote(*args), True

    def call(self, method: str, *args: Any) -> Pending:
        if self.remote:
            return Pending(getattr(self.handle, method).remote(*args), remote=True)
        return Pending(getattr(self.handle, method)(*args), remote=False)

    def close(self) -> None:
        if self.remote:
            ray.kill(self.handle)


class _Generation:
    """The engines' completions of one batch, each replica's share put back in prompt order."""

    def __init__(self, calls: list[tuple[int, Pending]]):
        self.calls = calls  # (index of the share's first prompt, the replica's call)

    def result(self) -> list[Completion]:
        return [
            dataclasses.replace(completion, prompt_index=start + completion.prompt_index, engine=replica)
            for replica, (start, call) in enumerate(self.calls)
            for completion in call.result()
        ]


class _Each:
    """A call on every replica: its result is each one's."""

    def __init__(self, calls: list[Pending]):
        self.calls = calls

    def result(self) -> list[Any]:
        return [call.result() for call in self.calls]


class EngineGroup:
    """The rollout engine replicas apart from the actor, each on its own Ray actor (``roles.rollout``): replica
    i samples the i-th contiguous share of a batch's prompts; after an actor update that makes a sync due, every
    replica loads the actor's weights, handed over through Ray's object store (put once, read by each)."""

    def __init__(self, params: Params, cfg: RLConfig, model_dir: Path):
        resources = cfg.roles.get("rollout", StageResources())
        self.replicas = [
            Worker(EngineWorker, (params, cfg, model_dir, replica), resources) for replica in range(cfg.rollout_engines)
        ]

    def call(self, method: str, *args: Any) -> Any:
        if method == "generate":
            (prompts,) = args
            sizes = [len(share) for share in torch.arange(len(prompts)).tensor_split(len(self.replicas))]
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            return _Generation(
                [
                    (start, replica.call("generate", prompts[start : start + size]))
                    for replica, start, size in zip(self.replicas, starts, sizes, strict=True)
                ]
            )
        if method == "load_weights":
            (weights,) = args
            shared = weights if weights is None or isinstance(weights, ray.ObjectRef) else ray.put(weights)
            return _Each([replica.call("load_weights", shared) for replica in self.replicas])
        if method == "state":
            return _Each([replica.call("state") for replica in self.replicas])
        if method == "load_state":
            (states,) = args
            return _Each([replica.call("load_state", s) for replica, s in zip(self.replicas, states, strict=True)])
        raise AttributeError(f"rollout engines have no {method!r}")

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()


def place(
    params: Params,
    cfg: RLConfig,
    policy_dir: Path,
    reward_dirs: list[Path],
    wanted: set[str],
    teacher_dir: Path | None = None,
    section: str = "rl",
) -> dict[str, Any]:
    """Start the ``wanted`` roles (the actor always), colocated in this process or each on its own Ray actor; the
    trained ones on ``parallel.num_workers`` data-parallel workers (``section`` names their params in errors);
    and the rollout engines (``rollout``: the actor itself when its engine lives in its process)."""
    critic_dir = reward_dirs[0] if cfg.critic_init == "reward" and reward_dirs else policy_dir
    roles = {
        "actor": (ActorWorker, (params, cfg, policy_dir)),
        "critic": (CriticWorker, (params, cfg, critic_dir)),
        "reference": (FrozenWorker, (params, cfg, policy_dir)),
        "reward": (RewardWorker, (params, cfg, reward_dirs)),
        "teacher": (FrozenWorker, (params, cfg, teacher_dir)),
    }
    if not cfg.colocate or not engine_in_actor(cfg):
        from tasks.common.cluster import connect_ray

        connect_ray(params.runner)

    def start(name: str, role: type, args: tuple) -> Any:
        if name in TRAINED_ROLES and cfg.parallel.num_workers > 1:
            return RoleGroup(role, args, cfg.parallel, f"{section}.parallel")
        return Worker(role, args, None if cfg.colocate else cfg.roles.get(name, StageResources()))

    started = {}
    try:
        for name, (role, args) in roles.items():
            if name == "actor" or name in wanted:
                started[name] = start(name, role, args)
        started["rollout"] = started["actor"] if engine_in_actor(cfg) else EngineGroup(params, cfg, policy_dir)
    except BaseException:
        release(started)
        raise
    return started


def release(roles: dict[str, Any]) -> None:
    """Stop the roles that run on Ray actors."""
    for role in {id(role): role for role in roles.values()}.values():  # the actor may be the rollout role too
        role.close()


@contextlib.contextmanager
def placed(*args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """``place``'s roles, released on exit."""
    roles = place(*args, **kwargs)
    try:
        yield roles
    finally:
        release(roles)


TRAINED_ROLES = ("actor", "critic")
