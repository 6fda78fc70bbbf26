"""The roles of an RL stage, each a self-contained worker that runs in the stage's process or as a Ray actor.

- actor: the policy being trained, with its rollout engine (HF or vLLM, synced in place after each update);
- critic: per-token values, trained on the returns (only for advantage estimators that need one);
- reference: the frozen initial policy, the KL anchor (only when a KL term or a reference reset is asked for);
- teacher: a frozen teacher that grades the student's tokens (on-policy distillation);
- reward: the frozen reward model(s), scoring (prompt, response) texts; an ensemble is combined by mean or min.

Workers exchange token tensors and texts, never models. ``place`` puts a role in this
process (``colocate``) or on its own Ray actor with the resources ``roles`` gives it;
the trainer calls both the same way and may run calls on different roles concurrently.
"""

import copy
import math
from pathlib import Path
from typing import Any

import ray
import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import PreTrainedModel

from models import load_critic, load_policy, load_reference, load_reward_model, load_tokenizer, resolve_device
from tasks.common.config import Params, RLConfig, StageResources
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


def _make_engine(params: Params, cfg: RLConfig, model: PreTrainedModel, tokenizer, model_dir: Path) -> RolloutEngine:
    if cfg.rollout_backend == "vllm":
        from tasks.rollout.vllm_engine import VLLMEngine  # vllm is optional: imported only when asked for

        engine = VLLMEngine(model_dir, seed=params.seed, max_model_len=model.config.max_position_embeddings)
        engine.sync_weights(model)
        return engine
    return HFEngine(model, tokenizer, params.eval.batch_size)


class _TrainedRole:
    """A role with a model, an optimizer and a schedule: its resumable state."""

    model: PreTrainedModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        restore_training_state(self.model, self.optimizer, self.scheduler, state)
        set_rng_state(state["rng"])


def _optimizer(model: torch.nn.Module, lr: float, cfg: RLConfig) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW with warm-up, then a constant rate or (``lr_schedule: cosine``) decay to 0 at the last iteration."""
    return adamw_with_cosine(model, lr, 0.0, cfg.warmup_steps, cfg.steps if cfg.lr_schedule == "cosine" else None)


class ActorWorker(_TrainedRole):
    """The policy, and the rollout engine that samples from it: from the policy itself (``sync_every: 1``) or,
    semi-online, from a copy of it (``sampler``) refreshed every ``sync_every`` updates."""

    def __init__(self, params: Params, cfg: RLConfig, model_dir: Path):
        self.cfg = cfg
        make_deterministic(params.seed)
        self.model = load_policy(model_dir, resolve_device(params.device))
        self.model.train()
        self.optimizer, self.scheduler = _optimizer(self.model, cfg.actor_lr, cfg)
        self.sampler = self.model if cfg.sync_every == 1 else copy.deepcopy(self.model).requires_grad_(False)
        self.updates, self.synced_at = 0, 0  # optimizer steps taken, and at which the engine was last synced
        self.tokenizer, self.batch_size = load_tokenizer(model_dir), params.eval.batch_size
        self.engine = _make_engine(params, cfg, self.sampler, self.tokenizer, model_dir)

    def generate(self, prompts: list[str]) -> list[Completion]:
        sampling = Sampling(self.cfg.max_new_tokens, n=self.cfg.group_size, temperature=self.cfg.temperature)
        return self.engine.generate(prompts, sampling)

    def sample_current(self, prompts: list[str], sampling: Sampling, seed: int) -> list[Completion]:
        """Samples of the policy as it is now (a semi-online engine may lag it), for held-out evaluation, drawn
        from ``seed`` without touching the random state training draws from."""
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return HFEngine(self.model, self.tokenizer, self.batch_size).generate(prompts, sampling)

    def _took_steps(self, steps: int) -> None:
        """Count ``steps`` optimizer steps and sync the engine once ``sync_every`` have passed since the last sync."""
        self.updates += steps
        if self.updates - self.synced_at >= self.cfg.sync_every:
            if self.sampler is not self.model:
                self.sampler.load_state_dict(self.model.state_dict())
            self.engine.sync_weights(self.sampler)
            self.synced_at = self.updates

    @torch.no_grad()
    def logprobs(self, batch: PackedBatch) -> torch.Tensor:
        return response_logprobs(self.model, batch.to(self.model.device), self.cfg.temperature)[0].cpu()

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
        when one is asked for, plus the distillation divergence ``cfg.loss`` to ``teacher_logits`` (B, T, V)
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
        for rows in minibatches:
            part = batch.select(rows).to(device)
            logprobs, logits = response_logprobs(self.model, part, cfg.temperature)
            mask = part.response_mask
            if from_update:
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
            loss = policy_loss - cfg.entropy_coef * entropy
            if kl_estimator is not None:
                loss = loss + kl_coef * masked_mean(kl_estimator(logprobs, ref_logprobs[rows].to(device)), mask)
            if teacher_logits is not None:
                teacher = teacher_logits[rows].to(device)
                student = logits[..., : teacher.shape[-1]]
                divergence = masked_mean(DISTILL_LOSSES[cfg.loss](student, teacher, mask, beta=cfg.beta), mask)
                loss = loss + divergence
                totals["divergence"] += divergence.item() / len(minibatches)
            grad_norm = guarded_step(self.model, self.optimizer, loss, cfg.grad_clip, "the actor's update")
            with torch.no_grad():
                # k3 estimate of KL(π_old ‖ π_θ) on the sampled tokens: how far this update moved the policy
                log_ratio = torch.where(mask.bool(), old - logprobs, 0)
                approx_kl = masked_mean(torch.expm1(log_ratio) - log_ratio, mask)
            names = ("policy_loss", "clip_fraction", "entropy", "approx_kl", "grad_norm")
            for name, value in zip(names, (policy_loss, clip_fraction, entropy, approx_kl, grad_norm), strict=True):
                totals[name] += value.item() / len(minibatches)
        self.scheduler.step()
        self._took_steps(len(minibatches))
        return totals, old_logprobs

    def preference_update(
        self, batch: PackedBatch, ref_logprobs: torch.Tensor | None
    ) -> tuple[dict[str, float], torch.Tensor]:
        """``epochs`` passes of minibatch steps on the preference loss ``cfg.loss`` over the P pairs of ``batch``
        (rows 0..P-1 chosen, P..2P-1 rejected; ``minibatch_size`` responses, half as many pairs, per step).
        Returns the metrics and each row's log-probs before the first step on it (B, T)."""
        cfg, device = self.cfg, self.model.device
        num_pairs = len(batch.input_ids) // 2
        minibatches = _minibatches(num_pairs, max(1, cfg.minibatch_size // 2), cfg.epochs)
        before = torch.zeros_like(batch.response_mask)
        seen = torch.zeros(len(before), dtype=torch.bool)
        names = ("preference_loss", "pair_accuracy", "margin", "chosen_logp", "rejected_logp", "entropy", "grad_norm")
        totals = dict.fromkeys(names, 0.0)
        for pair_rows in minibatches:
            rows = torch.cat([pair_rows, pair_rows + num_pairs])
            part = batch.select(rows).to(device)
            logprobs, logits = response_logprobs(self.model, part, cfg.temperature)
            fresh = ~seen[rows]
            before[rows[fresh]] = logprobs.detach().cpu()[fresh]
            seen[rows] = True
            sums, lengths = sequence_logprobs(logprobs, part.response_mask)
            reference = (None, None)
            if ref_logprobs is not None:
                reference = sequence_logprobs(ref_logprobs[rows].to(device), part.response_mask)[0].chunk(2)
            pairs = PairLogprobs(*sums.chunk(2), *lengths.chunk(2), *reference)
            losses, chosen, rejected = preference_loss(
                cfg.loss, pairs, cfg.beta, cfg.label_smoothing, cfg.simpo_gamma, cfg.sft_weight
            )
            with torch.no_grad():
                entropy = masked_mean(entropy_from_logits(logits), part.response_mask)
            grad_norm = guarded_step(self.model, self.optimizer, losses.mean(), cfg.grad_clip, "the actor's update")
            values = (
                losses.mean(),
                (chosen > rejected).float().mean(),
                (chosen - rejected).mean(),
                pairs.chosen.mean(),
                pairs.rejected.mean(),
                entropy,
                grad_norm,
            )
            for name, value in zip(names, values, strict=True):
                totals[name] += value.item() / len(minibatches)
        self.scheduler.step()
        self._took_steps(len(minibatches))
        return totals, before

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: tensor.detach().cpu().clone() for name, tensor in self.model.state_dict().items()}

    def state(self) -> dict[str, Any]:
        sampler = None if self.sampler is self.model else self.sampler.state_dict()
        return super().state() | {"sampler": sampler, "updates": self.updates, "synced_at": self.synced_at}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.updates, self.synced_at = state["updates"], state["synced_at"]
        if state["sampler"] is not None:
            self.sampler.load_state_dict(state["sampler"])
        self.engine.sync_weights(self.sampler)

    def save(self, out: Path, tokenizer_dir: Path) -> None:
        require_finite(self.model.state_dict(), "the policy, before saving it")
        self.model.save_pretrained(out)
        load_tokenizer(tokenizer_dir).save_pretrained(out)


class CriticWorker(_TrainedRole):
    def __init__(self, params: Params, cfg: RLConfig, model_dir: Path):
        self.cfg = cfg
        make_deterministic(params.seed + 1)
        self.model = load_critic(model_dir, resolve_device(params.device))
        self.model.train()
        self.optimizer, self.scheduler = _optimizer(self.model, cfg.critic_lr, cfg)

    def _values(self, batch: PackedBatch) -> torch.Tensor:
        return batch.response_logits(self.model(**batch.model_inputs()).logits).squeeze(-1).float()

    @torch.no_grad()
    def values(self, batch: PackedBatch) -> torch.Tensor:
        return self._values(batch.to(self.model.device)).cpu()

    def update(self, batch: PackedBatch, old_values: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
        cfg, device = self.cfg, self.model.device
        minibatches = _minibatches(len(old_values), cfg.minibatch_size, cfg.epochs)
        total = 0.0
        for rows in minibatches:
            part = batch.select(rows).to(device)
            loss = clipped_value_loss(
                self._values(part),
                old_values[rows].to(device),
                returns[rows].to(device),
                part.response_mask,
                cfg.value_clip,
            )
            guarded_step(self.model, self.optimizer, loss, cfg.grad_clip, "the critic's update")
            total += loss.item() / len(minibatches)
        self.scheduler.step()
        return {"value_loss": total}


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


class Pending:
    """A call's result: already computed (colocated) or a Ray object to fetch."""

    def __init__(self, value: Any, remote: bool):
        self.value, self.remote = value, remote

    def result(self) -> Any:
        return ray.get(self.value) if self.remote else self.value


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


def place(
    params: Params,
    cfg: RLConfig,
    policy_dir: Path,
    reward_dirs: list[Path],
    wanted: set[str],
    teacher_dir: Path | None = None,
) -> dict[str, Worker]:
    """Start the ``wanted`` roles (the actor always), colocated in this process or each on its own Ray actor."""
    critic_dir = reward_dirs[0] if cfg.critic_init == "reward" and reward_dirs else policy_dir
    roles = {
        "actor": (ActorWorker, (params, cfg, policy_dir)),
        "critic": (CriticWorker, (params, cfg, critic_dir)),
        "reference": (FrozenWorker, (params, cfg, policy_dir)),
        "reward": (RewardWorker, (params, cfg, reward_dirs)),
        "teacher": (FrozenWorker, (params, cfg, teacher_dir)),
    }
    if not cfg.colocate:
        from tasks.common.cluster import connect_ray

        connect_ray(params.runner)
    return {
        name: Worker(role, args, None if cfg.colocate else cfg.roles.get(name, StageResources()))
        for name, (role, args) in roles.items()
        if name == "actor" or name in wanted
    }
