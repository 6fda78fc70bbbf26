"""Stages `dpo_reference` and `dpo`: offline preference optimisation on logged pairs (the DPO family).

``dpo_reference`` computes the reference's summed log-probs of every chosen and rejected response of
``artifacts/preferences`` once, from ``dpo.init`` alone, into a versioned artifact; ``dpo`` then optimises
the loss ``dpo.preference_loss`` (``tasks/rl/preference_losses.py``) from that same model, reading the reference's
numbers instead of running the reference, so a change of beta or of the loss re-runs only the optimisation.
``dpo.pairs=verifier_separated`` trains on the pairs whose responses the task's verifier separates, one right and
one wrong, each label on its side.
The loop is ``tasks/common/training.py:fit`` (resumable, guarded against non-finite steps), on
``dpo.parallel.num_workers`` data-parallel workers.

Metrics: the training loss, implicit-reward accuracy and margin, the chosen and rejected responses'
log-probs (a falling chosen log-prob is a known failure of DPO, likelihood displacement: the run warns),
and at the end the held-out ``preference_accuracy``: the implicit reward margin is positive in the gold
judge's order (``tasks/data/judge.py:preference_metrics``).
"""

import functools
import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import PreTrainedModel

from models import context_length, load_reference, load_tokenizer, resolve_device
from models.trainable import trainable_policy
from tasks.common.artifacts import atomic_output, metrics_dir, model_dir, stage_dir
from tasks.common.config import DPOConfig, Params, to_dict
from tasks.common.distributed import Rank, data_parallel_step, run_data_parallel
from tasks.common.errors import MissingUpstreamError
from tasks.common.registry import StageRun
from tasks.common.training import Checkpointer, epoch_batch, fit, make_deterministic, rank_live, save_trained
from tasks.data.datasets import DatasetError, PreferencePair, read_examples, read_preferences
from tasks.data.judge import preference_metrics
from tasks.data.problems import Example, score_response
from tasks.data.prompts import PromptFormat
from tasks.rl.preference import TokenizedPair, pack_pairs, pair_logprobs, reference_logprobs, tokenize_pairs
from tasks.rl.preference_losses import PREFERENCE_LOSSES, preference_loss

REFERENCE_DIR = stage_dir("dpo_reference")
BELONGS_TO = "alignflow"  # the stored log-probs' metadata: the model and each split's pairs' digest, as JSON
REFERENCE_FILE = REFERENCE_DIR / "logprobs.safetensors"
SPLITS = ("train", "test")
# The chosen log-prob may drift a little either way; a fall past this (nats per response) is worth a warning.
CHOSEN_FALL_WARNING = 1.0


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pairs(preferences: Path, split: str) -> tuple[Path, list[PreferencePair]]:
    source = preferences / f"{split}.jsonl"
    return source, read_preferences(source)


def run_reference(stage: StageRun) -> None:
    params, init = stage.params, stage.inputs["init"]
    make_deterministic(params.seed)
    tokenizer, positions = load_tokenizer(init), context_length(init)
    model = load_reference(init, resolve_device(params.device))
    tensors, digests = {}, {}
    for split in SPLITS:
        source, pairs = _pairs(stage.inputs["preferences"], split)
        tokenized = tokenize_pairs(pairs, tokenizer, PromptFormat.of(params.task), source, positions)
        chosen, rejected = reference_logprobs(model, tokenized, tokenizer.pad_token_id, params.eval.batch_size)
        tensors |= {f"{split}.chosen": chosen.contiguous(), f"{split}.rejected": rejected.contiguous()}
        digests[split] = _digest(source)
    with atomic_output(REFERENCE_DIR) as out:
        out.mkdir()
        save_reference(out / REFERENCE_FILE.name, tensors, params.dpo.init, digests)
    print(f"dpo_reference: log-probs of {len(tensors['train.chosen'])} training pairs under {init}", flush=True)


def save_reference(path: Path, tensors: dict[str, torch.Tensor], init: str, digests: dict[str, str]) -> None:
    """The reference's log-probs, with the model and each split's pairs they belong to. One metadata entry:
    safetensors writes several in its hash map's order, which changes from process to process."""
    belongs_to = json.dumps({"model": init, **digests}, sort_keys=True)
    save_file(tensors, path, metadata={BELONGS_TO: belongs_to})


def stored_reference(
    split: str, source: Path, init: str, reference_file: Path = REFERENCE_FILE
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's (chosen, rejected) log-probs of ``split``, checked to belong to these pairs and this model."""
    if not reference_file.is_file():
        raise MissingUpstreamError(f"{reference_file}: not there yet; run `alignflow stage dpo_reference` first")
    with safe_open(reference_file, framework="pt") as stored:
        belongs_to = json.loads(stored.metadata().get(BELONGS_TO, "{}"))
        if belongs_to.get("model") != init or belongs_to.get(split) != _digest(source):
            raise MissingUpstreamError(
                f"{reference_file} holds the log-probs of other pairs or of another model than dpo.init={init!r}; "
                "run `alignflow stage dpo_reference` again"
            )
        return stored.get_tensor(f"{split}.chosen"), stored.get_tensor(f"{split}.rejected")


class PairScorer:
    """The DPO family's loss on the pairs of a split, by row index, against the reference: its stored log-probs
    (the dpo stage), or a frozen reference model run on every batch (how trainers without a reference pass work;
    bench/trl/dpo.py times both)."""

    def __init__(
        self,
        cfg: DPOConfig,
        pairs: list[TokenizedPair],
        reference: tuple[torch.Tensor, torch.Tensor] | PreTrainedModel,
        pad_id: int,
    ):
        self.cfg, self.pairs, self.pad_id, self.reference = cfg, pairs, pad_id, reference
        self.needs_reference = PREFERENCE_LOSSES[cfg.preference_loss].needs_reference

    def _reference(self, rows: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.needs_reference:
            return None
        if isinstance(self.reference, PreTrainedModel):
            chosen, rejected = reference_logprobs(self.reference, [self.pairs[i] for i in rows], self.pad_id, len(rows))
        else:
            chosen, rejected = (values[rows] for values in self.reference)
        return chosen.to(device), rejected.to(device)

    def __call__(self, model: PreTrainedModel, rows: list[int]) -> tuple[torch.Tensor, ...]:
        """(per-pair losses, chosen rewards, rejected rewards, chosen log-probs, rejected log-probs) of ``rows``."""
        cfg = self.cfg
        batch = pack_pairs([self.pairs[i] for i in rows], self.pad_id)
        scored = pair_logprobs(model, batch, self._reference(rows, model.device))
        losses, chosen, rejected = preference_loss(
            cfg.preference_loss, scored, cfg.beta, cfg.label_smoothing, cfg.simpo_gamma, cfg.sft_weight
        )
        return losses, chosen, rejected, scored.chosen.detach(), scored.rejected.detach()


def _chosen_trend(history: list[tuple[int, dict[str, float]]]) -> float:
    """How far the chosen responses' log-prob moved from the first logged interval to the last (nats)."""
    return history[-1][1]["chosen_logp"] - history[0][1]["chosen_logp"]


def verifier_separated(pairs: list[PreferencePair], examples: list[Example], source: Path) -> list[int]:
    """The indices of the pairs whose two responses the task's verifier separates: one correct, the other not.
    DatasetError naming ``source:line`` for a pair whose prompt is none of ``examples``' (nothing to verify by)."""
    by_prompt = {example.prompt: example for example in examples}
    separated = []
    for index, pair in enumerate(pairs):
        example = by_prompt.get(pair.prompt)
        if example is None:
            raise DatasetError(
                f"{source}:{index + 1}: the prompt {pair.prompt[:60]!r} is none of the training problems', so "
                "dpo.pairs=verifier_separated has no answer to verify its responses by"
            )
        if score_response(example, pair.chosen)[1] != score_response(example, pair.rejected)[1]:
            separated.append(index)
    return separated


def run(stage: StageRun) -> None:
    params, cfg, inputs = stage.params, stage.config, stage.inputs
    init, preferences = inputs["init"], inputs["preferences"]
    tokenizer, positions = load_tokenizer(init), context_length(init)
    scorers = {}
    for split in SPLITS:
        source, pairs = _pairs(preferences, split)
        tokenized = tokenize_pairs(pairs, tokenizer, PromptFormat.of(params.task), source, positions)
        chosen, rejected = stored_reference(split, source, cfg.init, inputs["reference"] / REFERENCE_FILE.name)
        if split == "train" and cfg.pairs == "verifier_separated":
            kept = verifier_separated(pairs, read_examples(inputs["data"] / "train.jsonl"), source)
            print(f"dpo: {len(kept)} of {len(pairs)} training pairs separated by the verifier", flush=True)
            pairs, tokenized = [pairs[i] for i in kept], [tokenized[i] for i in kept]
            chosen, rejected = chosen[kept], rejected[kept]
        scorers[split] = (pairs, PairScorer(cfg, tokenized, (chosen, rejected), tokenizer.pad_token_id))
    train_pairs, _ = scorers["train"]
    if len(train_pairs) < cfg.batch_size:
        raise DatasetError(
            f"{preferences / 'train.jsonl'}: {len(train_pairs)} pairs (dpo.pairs={cfg.pairs}), fewer than "
            f"dpo.batch_size={cfg.batch_size}"
        )
    checkpointer = Checkpointer(
        "dpo", {"stage": "dpo", "seed": params.seed, **to_dict(cfg)}, [init, preferences, inputs["reference"]]
    )
    with atomic_output(model_dir("dpo")) as out, atomic_output(metrics_dir("dpo")) as metrics:
        work = functools.partial(_train_rank, params, init, scorers, checkpointer, out, metrics)
        preference_accuracy, chosen_change = run_data_parallel(work, cfg.parallel, "dpo.parallel")
    checkpointer.clear()
    if chosen_change < -CHOSEN_FALL_WARNING:
        print(
            f"WARNING dpo: the chosen responses' log-prob fell {-chosen_change:.2f} nats over training "
            "(likelihood displacement: both responses are pushed down); dpo.sft_weight > 0 holds it up",
            flush=True,
        )
    print(f"dpo: held-out preference_accuracy={preference_accuracy:.3f}", flush=True)


def _train_rank(
    params: Params,
    init: Path,
    scorers: dict[str, tuple[list[PreferencePair], PairScorer]],
    checkpointer: Checkpointer,
    out: Path,
    metrics: Path,
    rank: Rank,
) -> tuple[float, float] | None:
    """One worker's share of ``run``: every rank builds the same model and trains on its share of each batch's
    pairs (an equal share: the mean of the ranks' per-pair means is the batch's). Rank 0 writes the model and its
    metrics and returns the held-out preference accuracy and how far the chosen log-prob moved."""
    cfg = params.dpo
    make_deterministic(params.seed)
    model = trainable_policy(init, resolve_device(params.device), cfg)
    model.train()
    train_pairs, score_train = scorers["train"]
    score = data_parallel_step(model, score_train, cfg.parallel.strategy, rank)

    def step_metrics(step: int) -> dict[str, torch.Tensor]:
        rows = epoch_batch(len(train_pairs), cfg.batch_size, step, params.seed)[rank.slice(cfg.batch_size)]
        losses, chosen, rejected, chosen_logp, rejected_logp = score(rows)
        return {
            "loss": losses.mean(),
            "accuracy": (chosen > rejected).float().mean(),
            "margin": (chosen - rejected).mean(),
            "chosen_logp": chosen_logp.mean(),
            "rejected_logp": rejected_logp.mean(),
        }

    with rank_live("dpo", rank, metrics) as live:
        history = fit("dpo", model, cfg, step_metrics, checkpointer, live, rank)
        held_out = _held_out(model, *scorers["test"], cfg.batch_size)
        save_trained(model, load_tokenizer(init), out, rank)
        if live is None:
            return None
        for name, value in held_out.items():
            live.summary[f"heldout/{name}"] = round(value, 6)
        accuracy = live.summary["preference_accuracy"] = round(held_out.get("accuracy", held_out["label_accuracy"]), 6)
        chosen_change = _chosen_trend(history)
        live.summary["chosen_logp_change"] = round(chosen_change, 6)
        live.make_summary()
    return accuracy, chosen_change


def _held_out(
    model: PreTrainedModel, pairs: list[PreferencePair], score: PairScorer, batch_size: int
) -> dict[str, float]:
    """``preference_metrics`` of the implicit rewards of ``pairs``. Every rank calls it: a sharded model's passes
    are collectives."""
    model.eval()
    with torch.no_grad():
        scored = [
            score(model, list(range(start, min(start + batch_size, len(pairs)))))
            for start in range(0, len(pairs), batch_size)
        ]
    chosen, rejected = (torch.cat([part[column] for part in scored]).cpu() for column in (1, 2))
    return preference_metrics(chosen, rejected, pairs)
