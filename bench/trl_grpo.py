"""The TRL leg of bench/grpo_vs_trl.py: TRL's GRPOTrainer on the same model, prompts, rewards and batch.

Runs in a virtual environment of its own that has TRL (the bench creates it); reads its settings as JSON from
argv[1] and writes the measured step times and token counts as JSON to argv[2]. The rewards are alignflow's
verifiers (``tasks.data.problems``, on PYTHONPATH), weighted as in the alignflow leg: accuracy and format.

With ``settings["chat"]`` each prompt is a conversation (the system prompt, when set, then the problem as the
user's message), which GRPOTrainer renders through the tokenizer's chat template; before training, the token ids it
gives the first prompts are checked against ``settings["expected_prompt_ids"]`` (alignflow's ids of the same
prompts). With ``settings["lora"]`` the policy trains LoRA adapters (``peft_config``) and the model saved is the
merged one.
"""

import json
import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer
from trl_timer import StepTimer, peft_config

from tasks.data.problems import Example, score_response


def _example(rows: dict, index: int) -> Example:
    return Example(
        rows["task"][index], rows["question"][index], rows["answer"][index], "", json.loads(rows["meta"][index])
    )


def _text(completion) -> str:
    """A completion's text: a conversational one is a list holding the assistant's message."""
    return completion[0]["content"] if isinstance(completion, list) else completion


def accuracy(prompts, completions, **rows) -> list[float]:
    return [float(score_response(_example(rows, i), _text(c))[1]) for i, c in enumerate(completions)]


def format_reward(prompts, completions, **rows) -> list[float]:
    return [float(score_response(_example(rows, i), _text(c))[0]) for i, c in enumerate(completions)]


def _prompt(settings: dict, question: str) -> str | list[dict[str, str]]:
    if not settings.get("chat"):
        return question
    system = settings.get("system_prompt")
    return [*([] if system is None else [{"role": "system", "content": system}]), {"role": "user", "content": question}]


def check_prompt_ids(trainer: GRPOTrainer, dataset: Dataset, expected: list[list[int]]) -> None:
    """The ids GRPOTrainer gives the first prompts are alignflow's, or the legs would train on different inputs."""
    if not expected:
        return
    ids = trainer._tokenize_prompts(dataset[: len(expected)]["prompt"])[0]
    for row, (ours, theirs) in enumerate(zip(expected, ids, strict=True)):
        if list(ours) != list(theirs):
            raise SystemExit(f"prompt {row}: TRL reads ids {list(theirs)}, alignflow {list(ours)}")
    print(f"TRL's prompt ids equal alignflow's on the first {len(expected)} prompts", flush=True)


def main(settings: dict, out: str) -> None:
    torch.manual_seed(settings["seed"])
    torch.set_num_threads(settings["threads"])
    rows = [json.loads(line) for line in open(settings["train_file"])]
    dataset = Dataset.from_list(
        [
            {
                "prompt": _prompt(settings, r["prompt"]),
                "question": r["prompt"],
                "answer": r["answer"],
                "task": r["task"],
                "meta": json.dumps(r["meta"]),
            }
            for r in rows
        ]
    )
    tokenizer = AutoTokenizer.from_pretrained(settings["model"])
    model = AutoModelForCausalLM.from_pretrained(settings["model"], dtype=torch.float32)
    completions = settings["prompts_per_step"] * settings["group_size"]
    config = GRPOConfig(
        output_dir=settings["output_dir"],
        max_steps=settings["steps"],
        per_device_train_batch_size=completions,  # one optimizer step per batch of prompts x group, as alignflow
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=settings["group_size"],
        max_completion_length=settings["max_new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=settings["lr"],
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=settings["warmup_steps"],
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=settings["kl_coef"],
        epsilon=settings["clip_low"],
        epsilon_high=settings["clip_high"],
        loss_type="dapo",
        scale_rewards="group",
        reward_weights=[1.0, settings["format_weight"]],
        remove_unused_columns=False,
        use_cpu=True,
        bf16=settings.get("bf16", False),  # on a CPU: the forward passes under bfloat16 autocast, fp32 weights
        seed=settings["seed"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        gradient_checkpointing=settings["gradient_checkpointing"],
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[accuracy, format_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=peft_config(settings.get("lora")),
    )
    check_prompt_ids(trainer, dataset, settings.get("expected_prompt_ids", []))
    trainer.train()
    if settings.get("lora"):
        trainer.model.merge_and_unload().save_pretrained(settings["output_dir"])
    else:
        trainer.save_model(settings["output_dir"])
    tokenizer.save_pretrained(settings["output_dir"])
    lengths = [
        entry["completions/mean_length"] for entry in trainer.state.log_history if "completions/mean_length" in entry
    ]
    with open(out, "w") as handle:
        json.dump({"step_seconds": timer.seconds, "mean_lengths": lengths, "completions_per_step": completions}, handle)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
