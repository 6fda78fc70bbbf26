"""Stage `reward_model`: Bradley–Terry reward models on the preference pairs, the SFT backbone plus a scalar head.

Loss −log σ(r_chosen − r_rejected) (``core_algos.bradley_terry_loss``); the score is read
at the last token of prompt + response + end-of-sequence. ``reward_model.ensemble_size`` models
are trained from different seeds (head initialisation and batch order) and saved as
``artifacts/reward_model/member-<i>``, each a Hugging Face directory; PPO combines their scores. Each
member trains in ``tasks/common/training.py:fit``, the loop SFT and DPO run: a checkpoint every
``save_every`` steps, and one of each finished member until the stage's output is written, so a run killed
in any member resumes there, to the weights an uninterrupted run gives.

Held-out metrics are for the ensemble's mean score: ``accuracy`` against the gold judge's
noise-free order, ``label_accuracy`` against the held-out labels as given, the mean
margin r_better − r_worse, and the mean reward of chosen and of rejected responses.
"""

import functools
from pathlib import Path

import torch

from models import load_reward_model, load_tokenizer, resolve_device
from models.trainable import prepared_for_training, weights_dtype
from tasks.common.artifacts import REWARD_MODEL_DIR, atomic_output
from tasks.common.config import OptimizationConfig, Params, RewardModelConfig, to_dict
from tasks.common.distributed import Rank, data_parallel, run_data_parallel
from tasks.common.registry import StageRun
from tasks.common.tracking import log_step, stage_live
from tasks.common.training import Checkpointer, epoch_batch, fit, make_deterministic, save_trained
from tasks.data.datasets import PreferencePair, read_preferences
from tasks.data.judge import preference_metrics
from tasks.data.prompts import PromptFormat
from tasks.rl.core_algos import bradley_terry_loss
from tasks.rl.sequences import pack_text


def _pair_scores(
    model: torch.nn.Module, tokenizer, prompt_format: PromptFormat, pairs: list[PreferencePair], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of chosen and rejected responses, computed in one forward pass."""
    prompts = [p.prompt for p in pairs] * 2
    responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    batch = pack_text(tokenizer, prompt_format, prompts, responses).to(device)
    scores = model(**batch.model_inputs()).logits.squeeze(-1).float()
    return scores[: len(pairs)], scores[len(pairs) :]


def _member_schedule(cfg: RewardModelConfig, num_pairs: int) -> OptimizationConfig:
    """A member's training in ``fit``'s terms: its epochs over ``num_pairs`` as a number of steps."""
    return OptimizationConfig(
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_steps,
        max_steps=num_pairs // cfg.batch_size * cfg.epochs,
        batch_size=cfg.batch_size,
        grad_clip=cfg.grad_clip,
        save_every=cfg.save_every,
        log_every=cfg.log_every,
        precision=cfg.precision,
    )


def train_member(
    params: Params,
    cfg: RewardModelConfig,
    backbone: Path,
    seed: int,
    pairs: list[PreferencePair],
    out: Path,
    checkpointer: Checkpointer,
) -> list[tuple[int, dict[str, float]]]:
    """Train one reward model from ``backbone`` with ``seed`` on ``cfg.parallel.num_workers`` data-parallel
    workers, resumable from ``checkpointer`` (which keeps the finished model's state too, until the caller clears
    it), and save it to ``out``; returns its logged training metrics (step, {name: value})."""
    work = functools.partial(_train_member_rank, params, cfg, backbone, seed, pairs, checkpointer, out)
    return run_data_parallel(work, cfg.parallel, "reward_model.parallel")


def _train_member_rank(
    params: Params,
    cfg: RewardModelConfig,
    backbone: Path,
    seed: int,
    pairs: list[PreferencePair],
    checkpointer: Checkpointer,
    out: Path,
    rank: Rank,
) -> list[tuple[int, dict[str, float]]]:
    """One worker's share of ``train_member``: every rank builds the same model and batches and trains on its
    pairs (an equal share of each batch: the mean of the ranks' Bradley-Terry losses is the batch's)."""
    make_deterministic(seed)
    tokenizer, prompt_format = load_tokenizer(backbone), PromptFormat.of(params.task)
    device = resolve_device(params.device)
    model = load_reward_model(backbone, device, trainable=True, dtype=weights_dtype(cfg.precision))
    model.config.pad_token_id = tokenizer.pad_token_id  # the score is read at the last non-pad token
    model = prepared_for_training(model, cfg)
    model.train()
    replica = data_parallel(model, cfg.parallel.strategy, rank)

    def step_metrics(step: int) -> dict[str, torch.Tensor]:
        batch = [pairs[i] for i in epoch_batch(len(pairs), cfg.batch_size, step, seed)][rank.slice(cfg.batch_size)]
        chosen, rejected = _pair_scores(replica, tokenizer, prompt_format, batch, device)
        return {"loss": bradley_terry_loss(chosen, rejected), "accuracy": (chosen > rejected).float().mean()}

    schedule = _member_schedule(cfg, len(pairs))
    # The stage logs each member's history under the member's name once it is trained: no live here.
    history = fit(f"reward_model {out.name}", model, schedule, step_metrics, checkpointer, None, rank, keep_final=True)
    save_trained(model, tokenizer, out, rank)
    return history


def run(stage: StageRun) -> None:
    params, cfg, inputs = stage.params, stage.config, stage.inputs
    train_pairs = read_preferences(inputs["preferences"] / "train.jsonl")
    test_pairs = read_preferences(inputs["preferences"] / "test.jsonl")
    if len(train_pairs) < cfg.batch_size:
        raise ValueError(
            f"reward_model: {len(train_pairs)} training pairs, fewer than reward_model.batch_size={cfg.batch_size}"
        )
    backbone = inputs["backbone"]
    config = {"stage": "reward_model", "seed": params.seed, **to_dict(cfg)}
    checkpointer = Checkpointer("reward_model", config, [backbone, inputs["preferences"]])
    with atomic_output(REWARD_MODEL_DIR) as out, stage_live("reward_model") as live:
        out.mkdir()
        held_out = []
        device = resolve_device(params.device)
        for member in range(cfg.ensemble_size):
            member_dir = out / f"member-{member}"
            part = checkpointer.part(member_dir.name)
            history = train_member(params, cfg, backbone, params.seed + member, train_pairs, member_dir, part)
            for step, metrics in history:
                log_step(live, step, metrics, prefix=f"{member_dir.name}/train/")
            model = load_reward_model(member_dir, device)
            with torch.no_grad():
                scores = _pair_scores(
                    model, load_tokenizer(member_dir), PromptFormat.of(params.task), test_pairs, device
                )
                held_out.append(scores)
        chosen = torch.stack([c for c, _ in held_out]).mean(0)
        rejected = torch.stack([r for _, r in held_out]).mean(0)
        metrics = preference_metrics(chosen, rejected, test_pairs)
        for name, value in metrics.items():
            live.log_metric(name, round(value, 6), plot=False)
    checkpointer.clear()
    print("reward_model: " + ", ".join(f"{name}={value:.3f}" for name, value in metrics.items()), flush=True)
