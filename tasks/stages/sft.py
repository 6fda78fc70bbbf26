"""Stages `sft`, `sft_cold`, `sft_rs@<round>` and `sft_distill`: supervised fine-tuning on worked solutions, loss
on response tokens only (an agent task's worked trace: the model's turns, tool calls included, are trained; what the
tools or the world answered is context). ``sft`` trains on the training split (RLHF's first stage), ``sft_cold`` on
its first few examples (R1's cold start), ``sft_rs@<round>`` on a round's rejection-sampled data (R1's second SFT),
``sft_distill`` on the teacher's verified responses (sequence-level distillation); each starts from the model its
section's ``init`` names.

The loop is ``tasks/common/training.py:fit``: AdamW with warm-up and cosine decay, gradient clipping, and a
checkpoint every ``save_every`` steps holding everything needed to continue bit-for-bit.
"""

import functools
from pathlib import Path

import torch

from models import load_tokenizer, resolve_device
from models.trainable import trainable_policy
from tasks.algos.supervised import sft_loss
from tasks.common.artifacts import atomic_output, metrics_dir, model_dir
from tasks.common.config import Params, SFTTrainingConfig, to_dict
from tasks.common.distributed import Rank, data_parallel, run_data_parallel
from tasks.common.registry import StageRun
from tasks.common.training import Checkpointer, epoch_batch, fit, make_deterministic, rank_live, save_trained
from tasks.data.datasets import DatasetError, read_examples, warn_unknown_characters
from tasks.data.observations import ObservationFormat
from tasks.data.problems import Example, trace_turns
from tasks.data.prompts import PromptFormat


class SFTBatches:
    """Tokenised (prompt, response) pairs served as padded batches in a seeded per-epoch order; a row over
    ``cfg``'s lengths is an error naming its params ``section`` (``sft_cold.max_length``)."""

    def __init__(
        self,
        examples: list[Example],
        tokenizer,
        prompt_format: PromptFormat,
        cfg: SFTTrainingConfig,
        source: Path,
        seed: int,
        section: str,
    ):
        self.sequences: list[tuple[list[int], list[int]]] = []  # (token ids, loss mask: 1 on the model's turns)
        observations = ObservationFormat(tokenizer, prompt_format.uses_template(tokenizer), [tokenizer.eos_token_id])
        prompts = prompt_format.encode_examples(tokenizer, examples)
        for row, (example, prompt) in enumerate(zip(examples, prompts, strict=True), start=1):
            form = prompt_format.for_example(example)
            ids, mask = list(prompt), [0] * len(prompt)
            for role, text in trace_turns(example):
                # the model's turns are trained, ended as it ends them; what the tools or the world said is context
                turn = form.response_ids(tokenizer, text) if role == "assistant" else observations.encode(text)
                ids, mask = ids + turn, mask + [int(role == "assistant")] * len(turn)
            too_long = [
                f"{what} is {length} tokens, over {section}.{limit}={getattr(cfg, limit)}"
                for what, length, limit in [
                    ("prompt", len(prompt), "max_prompt_length"),
                    ("prompt + solution", len(ids), "max_length"),
                ]
                if length > getattr(cfg, limit)
            ]
            if too_long:
                raise DatasetError(f"{source}:{row}: {too_long[0]}")
            self.sequences.append((ids, mask))
        if len(self.sequences) < cfg.batch_size:
            raise DatasetError(
                f"{source}: {len(self.sequences)} examples, fewer than {section}.batch_size={cfg.batch_size}"
            )
        self.batch_size, self.seed, self.pad_id = cfg.batch_size, seed, tokenizer.pad_token_id

    # A step's batch and its token count (throughput) draw the epoch order once; the batches live as long as the stage.
    @functools.lru_cache(maxsize=2)  # noqa: B019
    def rows(self, step: int) -> list[int]:
        """The sequences of batch ``step``."""
        return epoch_batch(len(self.sequences), self.batch_size, step, self.seed)

    def tokens(self, step: int) -> int:
        """The real (unpadded) tokens of batch ``step``."""
        return sum(len(self.sequences[i][0]) for i in self.rows(step))

    def __getitem__(self, step: int) -> dict[str, torch.Tensor]:
        chosen = [self.sequences[i] for i in self.rows(step)]
        width = max(len(ids) for ids, _ in chosen)
        input_ids = torch.full((len(chosen), width), self.pad_id, dtype=torch.long)
        loss_mask = torch.zeros((len(chosen), width))
        attention_mask = torch.zeros((len(chosen), width), dtype=torch.long)
        for row, (ids, mask) in enumerate(chosen):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention_mask[row, : len(ids)] = 1
            loss_mask[row, : len(ids)] = torch.tensor(mask, dtype=loss_mask.dtype)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


def train(params: Params, cfg: SFTTrainingConfig, stage: str, init_dir: Path, train_file: Path) -> None:
    """Fine-tune the model in ``init_dir`` on ``train_file`` and write it to ``artifacts/<stage>``, on
    ``cfg.parallel.num_workers`` data-parallel workers."""
    checkpointer = Checkpointer(stage, {"stage": stage, "seed": params.seed, **to_dict(cfg)}, [init_dir, train_file])
    with atomic_output(model_dir(stage)) as out, atomic_output(metrics_dir(stage)) as metrics:
        work = functools.partial(_train_rank, params, cfg, stage, init_dir, train_file, checkpointer, out, metrics)
        run_data_parallel(work, cfg.parallel, f"{stage.partition('@')[0]}.parallel")
    checkpointer.clear()


def _train_rank(
    params: Params,
    cfg: SFTTrainingConfig,
    stage: str,
    init_dir: Path,
    train_file: Path,
    checkpointer: Checkpointer,
    out: Path,
    metrics: Path,
    rank: Rank,
) -> None:
    """One worker's share of ``train``: every rank builds the same model and batches and trains on its rows."""
    make_deterministic(params.seed)
    device = resolve_device(params.device)
    tokenizer = load_tokenizer(init_dir)
    examples, prompt_format = read_examples(train_file)[: cfg.num_examples], PromptFormat.of(params.task)
    if rank.is_main:
        warn_unknown_characters(examples, tokenizer, train_file)
    batches = SFTBatches(examples, tokenizer, prompt_format, cfg, train_file, params.seed, stage.partition("@")[0])
    model = trainable_policy(init_dir, device, cfg)
    model.train()
    replica = data_parallel(model, cfg.parallel.strategy, rank)

    def step_metrics(step: int) -> dict[str, torch.Tensor]:
        batch = batches[step]
        rows = {name: tensor[rank.slice(len(tensor))].to(device) for name, tensor in batch.items()}
        # The sum over this rank's rows over the whole batch's tokens: averaged over the ranks, the batch's mean.
        num_tokens = None if rank.world_size == 1 else batch["loss_mask"][:, 1:].sum() / rank.world_size
        logits = replica(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"]).logits
        return {"loss": sft_loss(logits, rows["input_ids"], rows["loss_mask"], num_tokens)}

    with rank_live(stage, rank, metrics) as live:
        fit(stage, model, cfg, step_metrics, checkpointer, live, rank, tokens_of=batches.tokens)
        if live is not None:
            live.make_summary()
        save_trained(model, tokenizer, out, rank)


def run(stage: StageRun) -> None:
    """Every SFT kind: fine-tune its ``init`` input on its ``data`` input's training split."""
    train(stage.params, stage.config, stage.name, stage.inputs["init"], stage.inputs["data"] / "train.jsonl")
