"""The TRL leg of the on-policy distillation bench: TRL's GKDTrainer on the same student, teacher, prompts and batch.

Runs in the virtual environment with TRL that the benches create; reads its settings as JSON from argv[1]
and writes the measured optimizer-step times as JSON to argv[2]; the trained student goes to the settings'
``output_dir`` for the bench to evaluate.

The rows are plain text and the character tokenizer has no chat template, so instead of GKD's conversational
``messages`` the dataset is pre-tokenised: the collator (``DataCollatorForChatML``) takes ``input_ids`` as is and
splits prompt from completion at the first 1 of ``completion_mask``. The ids are alignflow's: the prompt as the
tokenizer encodes it (beginning-of-sequence first), the solution without one and ended by end-of-sequence.
"""

import json
import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.experimental.gkd import GKDConfig, GKDTrainer

from bench.trl.legs import StepTimer, save_trained, training_arguments


def _tokenized(tokenizer, prompt: str, solution: str) -> dict:
    prompt_ids = tokenizer(prompt)["input_ids"]
    completion_ids = tokenizer(solution, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    # "prompt" is never read on this path, but the collator looks it up before it looks at input_ids and falls
    # back to "messages" (which these rows lack) when it is missing.
    return {
        "prompt": prompt,
        "input_ids": prompt_ids + completion_ids,
        "completion_mask": [0] * len(prompt_ids) + [1] * len(completion_ids),
    }


def main(settings: dict, out: str) -> None:
    torch.manual_seed(settings["seed"])
    torch.set_num_threads(settings["threads"])
    tokenizer = AutoTokenizer.from_pretrained(settings["student"])
    rows = [json.loads(line) for line in open(settings["train_file"])]
    # With lmbda=1 the solutions are never trained on, yet still needed: the Trainer counts their tokens as the
    # loss's normaliser (num_items_in_batch), and a batch with none of them would divide by zero.
    dataset = Dataset.from_list([_tokenized(tokenizer, row["prompt"], row["solution"]) for row in rows])
    student = AutoModelForCausalLM.from_pretrained(settings["student"], dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(settings["teacher"], dtype=torch.float32)
    config = GKDConfig(
        # gradient checkpointing as the settings say: GKDConfig inherits SFTConfig's default of True, which also turns
        # off the KV cache in on-policy generation
        **training_arguments(settings),
        per_device_train_batch_size=settings["batch_size"],
        learning_rate=settings["lr"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        lmbda=settings["lmbda"],
        beta=settings["beta"],
        temperature=settings["temperature"],  # sampling only: GKDTrainer scores the divergence at temperature 1
        max_new_tokens=settings["max_new_tokens"],
        seq_kd=False,
        bf16=False,
        logging_steps=10,
    )
    timer = StepTimer()
    trainer = GKDTrainer(
        model=student,
        teacher_model=teacher,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    save_trained(trainer, tokenizer, settings)
    with open(out, "w") as handle:
        json.dump({"step_seconds": timer.seconds}, handle)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
