"""Stage `reward_model`: Bradley–Terry reward models on the preference pairs, the SFT backbone plus a scalar head.

Loss −log σ(r_chosen − r_rejected) (``core_algos.bradley_terry_loss``); the score is read
at the last token of prompt + response + end-of-sequence. ``reward_model.ensemble_size`` models
are trained from different seeds (head initialisation and batch order) and saved as
``artifacts/reward_model/member-<i>``, each a Hugging Face directory; PPO combines their scores.

Held-out metrics are for the ensemble's mean score: ``accuracy`` against the gold judge's
noise-free order, ``label_accuracy`` against the held-out labels as given, the mean
margin r_better − r_worse, and the mean reward of chosen and of rejected responses.
"""

from pathlib import Path

import torch
from dvclive import Live
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from models import load_reward_model, load_tokenizer, resolve_device
from tasks.common.artifacts import PREFERENCES_DIR, REWARD_MODEL_DIR, atomic_output, upstream_model
from tasks.common.config import Params, RewardModelConfig
from tasks.common.tracking import stage_live
from tasks.common.training import adamw_with_cosine, epoch_batch, guarded_step, make_deterministic
from tasks.data.datasets import PreferencePair, read_preferences
from tasks.data.judge import preference_metrics
from tasks.rl.core_algos import bradley_terry_loss
from tasks.rl.sequences import pack_text


def _pair_scores(model, tokenizer, pairs: list[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of chosen and rejected responses, computed in one forward pass."""
    prompts = [p.prompt for p in pairs] * 2
    responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    batch = pack_text(tokenizer, prompts, responses).to(model.device)
    scores = model(**batch.model_inputs()).logits.squeeze(-1).float()
    return scores[: len(pairs)], scores[len(pairs) :]


def train_member(
    params: Params, cfg: RewardModelConfig, seed: int, pairs: list[PreferencePair], out: Path, live: Live
) -> PreTrainedModel:
    """Train one reward model from the SFT backbone with ``seed``, save it to ``out``; metrics under out's name."""
    make_deterministic(seed)
    backbone = upstream_model(cfg.backbone)
    tokenizer = load_tokenizer(backbone)
    model = load_reward_model(backbone, resolve_device(params.device), trainable=True)
    model.config.pad_token_id = tokenizer.pad_token_id  # the score is read at the last non-pad token
    model.train()
    total_steps = len(pairs) // cfg.batch_size * cfg.epochs
    optimizer, scheduler = adamw_with_cosine(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps, total_steps)
    for step in tqdm(range(total_steps), desc=f"reward {out.name}"):
        batch = [pairs[i] for i in epoch_batch(len(pairs), cfg.batch_size, step, seed)]
        chosen, rejected = _pair_scores(model, tokenizer, batch)
        loss = bradley_terry_loss(chosen, rejected)
        guarded_step(model, optimizer, loss, cfg.grad_clip, f"reward_model {out.name} step {step + 1}")
        scheduler.step()
        if (step + 1) % cfg.log_every == 0 or step + 1 == total_steps:
            live.step = step + 1
            live.log_metric(f"{out.name}/train/loss", round(loss.item(), 6))
            live.log_metric(f"{out.name}/train/accuracy", round((chosen > rejected).float().mean().item(), 6))
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model


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
        for member in range(cfg.ensemble_size):
            model = train_member(params, cfg, params.seed + member, train_pairs, out / f"member-{member}", live)
            with torch.no_grad():
                held_out.append(_pair_scores(model, load_tokenizer(out / f"member-{member}"), test_pairs))
        chosen = torch.stack([c for c, _ in held_out]).mean(0)
        rejected = torch.stack([r for _, r in held_out]).mean(0)
        metrics = preference_metrics(chosen, rejected, test_pairs)
        for name, value in metrics.items():
            live.log_metric(name, round(value, 6), plot=False)
    print("reward_model: " + ", ".join(f"{name}={value:.3f}" for name, value in metrics.items()), flush=True)
