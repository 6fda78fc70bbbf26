"""The TRL leg of ``bench.trl.dpo``: TRL's DPOTrainer on the same model, pairs, batch size and loss.

Runs in the virtual environment with TRL that the benches create; reads its settings as JSON from argv[1]
and writes the measured optimizer-step times as JSON to argv[2]; the trained model goes to the settings'
``output_dir`` for the bench to evaluate.

The pairs' prompts come as the model reads them (through its chat template, rendered by the bench), so TRL
tokenises prompt + response as text and appends the end-of-sequence token, as alignflow does; before training, the
token ids of the first pairs are checked against ``settings["expected_ids"]`` (alignflow's). With
``settings["lora"]`` the policy trains LoRA adapters (``peft_config``; the reference is the model with its adapters
disabled) and the model saved is the merged one.
"""

import json
import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer

from bench.trl.legs import StepTimer, peft_config, save_trained, training_arguments


def check_ids(trainer: DPOTrainer, expected: list[list[list[int]]]) -> None:
    """The (prompt, chosen, rejected) ids DPOTrainer made of the first pairs are alignflow's."""
    for row, ours in enumerate(expected):
        tokenized = trainer.train_dataset[row]
        theirs = [tokenized[column] for column in ("prompt_ids", "chosen_ids", "rejected_ids")]
        if [list(ids) for ids in ours] != [list(ids) for ids in theirs]:
            raise SystemExit(f"pair {row}: TRL reads ids {theirs}, alignflow {ours}")
    if expected:
        print(f"TRL's token ids equal alignflow's on the first {len(expected)} pairs", flush=True)


def main(settings: dict, out: str) -> None:
    torch.manual_seed(settings["seed"])
    torch.set_num_threads(settings["threads"])
    rows = [json.loads(line) for line in open(settings["train_file"])]
    dataset = Dataset.from_list([{key: row[key] for key in ("prompt", "chosen", "rejected")} for row in rows])
    tokenizer = AutoTokenizer.from_pretrained(settings["model"])
    model = AutoModelForCausalLM.from_pretrained(settings["model"], dtype=torch.float32)
    config = DPOConfig(
        **training_arguments(settings),
        per_device_train_batch_size=settings["batch_size"],
        learning_rate=settings["lr"],
        lr_scheduler_type="cosine",
        warmup_steps=settings["warmup_steps"],
        weight_decay=settings["weight_decay"],
        beta=settings["beta"],
        loss_type=["sigmoid"],
        precompute_ref_log_probs=settings["precompute_ref_log_probs"],
        max_length=None,
        bf16=settings.get("bf16", False),  # on a CPU: the forward passes under bfloat16 autocast, fp32 weights
        logging_steps=10,
    )
    timer = StepTimer()
    trainer = DPOTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=peft_config(settings.get("lora")),
    )
    check_ids(trainer, settings.get("expected_ids", []))
    trainer.train()
    save_trained(trainer, tokenizer, settings)
    with open(out, "w") as handle:
        json.dump({"step_seconds": timer.seconds}, handle)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
