"""Stage `reward_model`: Bradley–Terry reward models on the preference pairs, the SFT backbone plus a scalar head.

Loss −log σ(r_chosen − r_rejected) (``core_algos.bradley_terry_loss``); the score is read
at the last token of prompt + response + end-of-sequence. ``reward_model.ensemble_size`` models
are trained from different seeds (head initialisation and batch order) and saved as
``artifacts/reward_model/member-<i>``, each a Hugging Face directory; PPO combines their scores.

Held-out metrics are for the ensemble's mean score: ``accuracy`` against the gold judge's
noise-free order, ``label_accuracy`` against the held-out labels as given, the mean
margin r_better − r_worse, and the mean reward of chosen and of rejected responses.
"""

import functools
from pathlib import Path

import torch
from tqdm.auto import tqdm

from models import load_reward_model, load_tokenizer, resolve_device
from tasks.common.artifacts import PREFERENCES_DIR, REWARD_MODEL_DIR, atomic_output, upstream_model
from tasks.common.config import Params, RewardModelConfig
from tasks.common.distributed import Rank, data_parallel, full_state_dict, run_data_parallel
from tasks.common.errors import NonFiniteError
from tasks.common.tracking import stage_live
from tasks.common.training import adamw_with_cosine, epoch_batch, guarded_step, make_deterministic
from tasks.data.datasets import PreferencePair, read_preferences
from tasks.data.judge import preference_metrics
from tasks.rl.core_algos import bradley_terry_loss
from tasks.rl.sequences import pack_text


def _pair_scores(
    model: torch.nn.Module, tokenizer, pairs: list[PreferencePair], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of chosen and rejected responses, computed in one forward pass."""
    prompts = [p.prompt for p in pairs] * 2
    responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    batch = pack_text(tokenizer, prompts, responses).to(device)
    scores = model(**batch.model_inputs()).logits.squeeze(-1).float()
    return scores[: len(pairs)], scores[len(pairs) :]


def train_member(
    params: Params, cfg: RewardModelConfig, seed: int, pairs: list[PreferencePair], out: Path
) -> list[tuple[int, dict[str, float]]]:
    """Train one reward model from the backbone with ``seed`` on ``cfg.parallel.num_workers`` data-parallel
    workers and save it to ``out``; returns its logged training metrics (step, {name: value})."""
    work = functools.partial(_train_member_rank, params, cfg, seed, pairs, out)
    return run_data_parallel(work, cfg.parallel, "reward_model.parallel")


def _train_member_rank(
    params: Params, cfg: RewardModelConfig, seed: int, pairs: list[PreferencePair], out: Path, rank: Rank
) -> list[tuple[int, dict[str, float]]]:
    """One worker's share of ``train_member``: every rank builds the same model and batches and trains on its
    pairs (an equal share of each batch: the mean of the ranks' Bradley-Terry losses is the batch's)."""
    make_deterministic(seed)
    backbone = upstream_model(cfg.backbone)
    tokenizer = load_tokenizer(backbone)
    device = resolve_device(params.device)
    model = load_reward_model(backbone, device, trainable=True)
    model.config.pad_token_id = tokenizer.pad_token_id  # the score is read at the last non-pad token
    model.train()
    replica = data_parallel(model, cfg.parallel.strategy, rank)
    total_steps = len(pairs) // cfg.batch_size * cfg.epochs
    optimizer, scheduler = adamw_with_cosine(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps, total_steps)
    history = []
    for step in tqdm(range(total_steps), desc=f"reward {out.name}", disable=not rank.is_main):
        batch = [pairs[i] for i in epoch_batch(len(pairs), cfg.batch_size, step, seed)][rank.slice(cfg.batch_size)]
        chosen, rejected = _pair_scores(replica, tokenizer, batch, device)
        loss = bradley_terry_loss(chosen, rejected)
        if rank.any(not torch.isfinite(loss)):  # every rank stops together, or the others wait forever
            raise NonFiniteError(f"reward_model {out.name} step {step + 1}: the loss is {rank.sum(loss).item()}")
        guarded_step(model, optimizer, loss, cfg.grad_clip, f"reward_model {out.name} step {step + 1}")
        scheduler.step()
        if (step + 1) % cfg.log_every == 0 or step + 1 == total_steps:
            metrics = {"loss": loss, "accuracy": (chosen > rejected).float().mean()}
            history.append((step + 1, {name: round(rank.mean(value).item(), 6) for name, value in metrics.items()}))
    weights = full_state_dict(model, rank)
    if rank.is_main:
        model.save_pretrained(out, state_dict=weights)
        tokenizer.save_pretrained(out)
    return history


def run(params: Params) -> None:
    cfg = params.reward_model
    train_pairs = read_preferences(PREFERENCES_DIR / "train.jsonl")
    test_pairs = read_preferences(PREFERENCES_DIR / "test.jsonl")
    if len(train_pairs) < cfg.batch_size:
        raise ValueError(
            f"reward_model: {len(train_pairs)} training pairs, fewer than reward_model.batch_size={cfg.batch_size}"
        )
    with atomic_output(REWARD_MODEL_DIR) as out, stage_live("reward_model") as live:
        out.mkdir()
        held_out = []
        device = resolve_device(params.device)
        for member in range(cfg.ensemble_size):
            member_dir = out / f"member-{member}"
            for step, metrics in train_member(params, cfg, params.seed + member, train_pairs, member_dir):
                live.step = step
                for name, value in metrics.items():
                    live.log_metric(f"{member_dir.name}/train/{name}", value)
            model = load_reward_model(member_dir, device)
            with torch.no_grad():
                held_out.append(_pair_scores(model, load_tokenizer(member_dir), test_pairs, device))
        chosen = torch.stack([c for c, _ in held_out]).mean(0)
        rejected = torch.stack([r for _, r in held_out]).mean(0)
        metrics = preference_metrics(chosen, rejected, test_pairs)
        for name, value in metrics.items():
            live.log_metric(name, round(value, 6), plot=False)
    print("reward_model: " + ", ".join(f"{name}={value:.3f}" for name, value in metrics.items()), flush=True)
