"""Stage `reward_model`: reward models on the preference pairs, of the kind ``reward_model.kind`` names.

The kinds and their score functions are ``tasks/rl/reward_kinds.py``. A kind that trains starts from
``reward_model.backbone`` and minimises the Bradley–Terry loss −log σ(r_chosen − r_rejected) on its score, plus
``lm_coef`` × the chosen responses' token NLL where it reads an LM head; ``reward_model.ensemble_size`` members are
trained from different seeds (head initialisation and batch order) and saved as ``artifacts/reward_model/member-<i>``,
each a Hugging Face directory; the consumers combine their scores. Each member trains in
``tasks/common/training.py:fit``, the loop SFT and DPO run: a checkpoint every ``save_every`` steps, and one of each
finished member until the stage's output is written, so a run killed in any member resumes there, to the weights an
uninterrupted run gives. A kind that does not train (likelihood, implicit) saves its backbone as it is (and the
implicit kind the backbone's reference beside it). ``scoring.json`` holds the scoring rule.

Held-out metrics are for the ensemble's mean score: ``accuracy`` against the gold judge's
noise-free order, ``label_accuracy`` against the held-out labels as given, the mean
margin r_better − r_worse, and the mean reward of chosen and of rejected responses.

With ``reward_model.judge`` a judge of the same kind is trained the other way round: on the held-out pairs, scored
on the training pairs (``judge/...``), and saved as ``artifacts/reward_model/judge``. The training reward never saw
its pairs, so the RL stages' over-optimisation guard (``tasks/rl/guard.py``) reads it to tell a real gain from an
exploited reward model.
"""

import functools
import shutil
import time
from pathlib import Path

import torch

from models import load_policy, load_reward_model, load_tokenizer, resolve_device
from models.trainable import prepared_for_training, weights_dtype
from tasks.algos.supervised import bradley_terry_loss
from tasks.algos.tokens import masked, masked_mean
from tasks.common.artifacts import JUDGE, REWARD_MODEL_DIR, atomic_output, member_dirs, model_dir
from tasks.common.config import OptimizationConfig, Params, RewardModelConfig, to_dict
from tasks.common.distributed import Rank, data_parallel_step, run_data_parallel
from tasks.common.errors import warn
from tasks.common.registry import StageRun
from tasks.common.tracking import log_step, stage_live
from tasks.common.training import Checkpointer, epoch_batch, fit, make_deterministic, save_trained
from tasks.data.datasets import PreferencePair, read_preferences
from tasks.data.judge import preference_metrics
from tasks.data.prompts import PromptFormat
from tasks.rl.reward_kinds import (
    REFERENCE_DIR,
    REWARD_KINDS,
    Frozen,
    RewardModel,
    Scoring,
    implicit_reference,
    pack_scored,
)


def scoring_rule(params: Params, cfg: RewardModelConfig) -> Scoring:
    """The scoring rule ``cfg`` asks for (for the implicit kind, with the β its backbone was trained with)."""
    entry, reference = REWARD_KINDS[cfg.kind], implicit_reference(params, cfg.backbone)
    return Scoring(
        cfg.kind,
        verdict_suffix=cfg.verdict_suffix if entry.suffix else "",
        verdict_token=cfg.verdict_token if entry.suffix else "",
        beta=reference[1] if entry.needs_reference and reference is not None else 1.0,
    )


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
    device, entry, scoring = resolve_device(params.device), REWARD_KINDS[cfg.kind], scoring_rule(params, cfg)
    frozen = Frozen(scoring)
    if entry.lm_loss and entry.head == "classifier":  # grm: the backbone's own LM head reads the hidden states
        frozen.lm_head = load_policy(backbone, device).get_output_embeddings().weight.detach().clone()
    if entry.head == "classifier":
        model = load_reward_model(backbone, device, trainable=True, dtype=weights_dtype(cfg.precision))
    else:
        model = load_policy(backbone, device, weights_dtype(cfg.precision))
    model.config.pad_token_id = tokenizer.pad_token_id  # a classifier reads its score at the last non-pad token
    model = prepared_for_training(model, cfg)
    model.train()
    replica = data_parallel_step(
        model, functools.partial(_kind_step, entry.function, frozen), cfg.parallel.strategy, rank
    )

    def step_metrics(step: int) -> dict[str, torch.Tensor]:
        whole = [pairs[i] for i in epoch_batch(len(pairs), cfg.batch_size, step, seed)]
        chosen_ids = [prompt_format.response_ids(tokenizer, p.chosen) for p in whole]  # the whole batch's, once
        share = rank.slice(cfg.batch_size)
        batch = whole[share]
        prompts = prompt_format.encode(tokenizer, [p.prompt for p in batch]) * 2
        finished = chosen_ids[share] + [prompt_format.response_ids(tokenizer, p.rejected) for p in batch]
        packed, mask = pack_scored(tokenizer, scoring, prompts, finished)
        scores, lm_logprobs = replica(packed.to(device), mask.to(device))
        chosen, rejected = scores[: len(batch)], scores[len(batch) :]
        metrics = {"loss": bradley_terry_loss(chosen, rejected), "accuracy": (chosen > rejected).float().mean()}
        if entry.lm_loss and cfg.lm_coef > 0:
            chosen_mask = mask[: len(batch)].to(device)
            if rank.world_size == 1:
                metrics["lm_loss"] = -masked_mean(lm_logprobs[: len(batch)], chosen_mask)
            else:  # this rank's share of the whole batch's token mean, as SFT's workers take theirs
                tokens = sum(len(ids) for ids in chosen_ids) / rank.world_size
                metrics["lm_loss"] = -(masked(lm_logprobs[: len(batch)], chosen_mask)).sum() / tokens
            metrics["loss"] = metrics["loss"] + cfg.lm_coef * metrics["lm_loss"]
        return metrics

    schedule = _member_schedule(cfg, len(pairs))
    # The stage logs each member's history under the member's name once it is trained: no live here.
    history = fit(f"reward_model {out.name}", model, schedule, step_metrics, checkpointer, None, rank, keep_final=True)
    save_trained(model, tokenizer, out, rank)
    return history


def _kind_step(
    function, frozen: Frozen, model: torch.nn.Module, batch, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The kind's forward pass as a data-parallel step: (scores, LM log-probs of the response tokens)."""
    out = function(model, batch, mask, frozen)
    return out.scores, out.lm_logprobs


def _held_out_scores(params: Params, member: Path, pairs: list[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor]:
    """One member's scores of the chosen and the rejected responses of ``pairs``."""
    reward_model = RewardModel(member, resolve_device(params.device))
    prompts = [p.prompt for p in pairs] * 2
    responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    scores = reward_model.score_texts(PromptFormat.of(params.task), prompts, responses, params.eval.batch_size)
    return scores[: len(pairs)], scores[len(pairs) :]


def run(stage: StageRun) -> None:
    params, cfg, inputs = stage.params, stage.config, stage.inputs
    train_pairs = read_preferences(inputs["preferences"] / "train.jsonl")
    test_pairs = read_preferences(inputs["preferences"] / "test.jsonl")
    backbone, entry = inputs["backbone"], REWARD_KINDS[cfg.kind]
    if len(train_pairs) < cfg.batch_size:
        raise ValueError(
            f"reward_model: {len(train_pairs)} training pairs, fewer than reward_model.batch_size={cfg.batch_size}"
        )
    judged = entry.trains and cfg.judge
    if judged and len(test_pairs) < cfg.batch_size:
        warn(
            f"reward_model.judge: {len(test_pairs)} held-out pairs, fewer than reward_model.batch_size="
            f"{cfg.batch_size}: no judge is trained, so the RL stages' guard (guard.signal: auto) keeps their last "
            "iteration"
        )
        judged = False
    config = {"stage": "reward_model", "seed": params.seed, **to_dict(cfg)}
    checkpointer = Checkpointer("reward_model", config, [backbone, inputs["preferences"]])
    with atomic_output(REWARD_MODEL_DIR) as out, stage_live("reward_model") as live:
        out.mkdir()
        scoring_rule(params, cfg).save(out)
        started = time.perf_counter()
        if not entry.trains:
            shutil.copytree(backbone, out / "member-0")
        if entry.needs_reference:
            shutil.copytree(model_dir(implicit_reference(params, cfg.backbone)[0]), out / REFERENCE_DIR)
        for member in range(cfg.ensemble_size if entry.trains else 0):
            member_dir = out / f"member-{member}"
            part = checkpointer.part(member_dir.name)
            history = train_member(params, cfg, backbone, params.seed + member, train_pairs, member_dir, part)
            for step, metrics in history:
                log_step(live, step, metrics, prefix=f"{member_dir.name}/train/")
        if judged:
            # its own seed, past every member's: the judge is not one of them
            judge_seed = params.seed + cfg.ensemble_size
            history = train_member(params, cfg, backbone, judge_seed, test_pairs, out / JUDGE, checkpointer.part(JUDGE))
            for step, metrics in history:
                log_step(live, step, metrics, prefix=f"{JUDGE}/train/")
        train_seconds = time.perf_counter() - started
        held_out = [_held_out_scores(params, member, test_pairs) for member in member_dirs(out)]
        chosen = torch.stack([c for c, _ in held_out]).mean(0)
        rejected = torch.stack([r for _, r in held_out]).mean(0)
        metrics = preference_metrics(chosen, rejected, test_pairs)
        if judged:
            judge_metrics = preference_metrics(*_held_out_scores(params, out / JUDGE, train_pairs), train_pairs)
            metrics |= {f"{JUDGE}/{name}": value for name, value in judge_metrics.items()}
        for name, value in metrics.items():
            live.log_metric(name, round(value, 6), plot=False)
    checkpointer.clear()
    print(
        f"reward_model ({cfg.kind}, {train_seconds:.0f} s): "
        + ", ".join(f"{name}={value:.3f}" for name, value in metrics.items()),
        flush=True,
    )
