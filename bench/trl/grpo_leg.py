"""The TRL leg of ``bench.trl.grpo``: TRL's GRPOTrainer on the same model, prompts, rewards and batch.

Runs in a virtual environment of its own that has TRL (the bench creates it); reads its settings as JSON from
argv[1] and writes the measured step times and token counts as JSON to argv[2]. The rewards are alignflow's
verifiers (``tasks.data.problems``, on PYTHONPATH), weighted as in the alignflow leg: accuracy and format. The
bench's in-process form (``bench.trl.grpo_in_process``, on a GPU) builds its trainer here too (``grpo_trainer``).

With ``settings["chat"]`` each prompt is a conversation (the system prompt, when set, then the problem as the
user's message), which GRPOTrainer renders through the tokenizer's chat template; before training, the token ids of
the first prompts, as GRPOTrainer tokenizes them, are checked against ``settings["expected_prompt_ids"]``
(alignflow's ids of the same prompts). With ``settings["lora"]`` the policy trains LoRA adapters (``peft_config``)
and the model saved is the merged one.
"""

import json
import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from bench.trl.legs import StepTimer, peft_config, save_trained, training_arguments
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


def trl_prompt_ids(tokenizer, prompts: list) -> list[list[int]]:
    """The token ids GRPOTrainer gives ``prompts``, by the tokenizer's public API as GRPOTrainer calls it: a
    conversation through the chat template with the generation prompt, a text as it is."""
    if isinstance(prompts[0], list):
        rendered = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True, return_dict=True)
        return rendered["input_ids"]
    return tokenizer(text=prompts)["input_ids"]


def check_prompt_ids(tokenizer, dataset: Dataset, expected: list[list[int]]) -> None:
    """The ids GRPOTrainer gives the first prompts are alignflow's, or the legs would train on different inputs."""
    if not expected:
        return
    ids = trl_prompt_ids(tokenizer, dataset[: len(expected)]["prompt"])
    for row, (ours, theirs) in enumerate(zip(expected, ids, strict=True)):
        if list(ours) != list(theirs):
            raise SystemExit(f"prompt {row}: TRL reads ids {list(theirs)}, alignflow {list(ours)}")
    print(f"TRL's prompt ids equal alignflow's on the first {len(expected)} prompts", flush=True)


def grpo_config(settings: dict) -> GRPOConfig:
    """GRPOConfig of the bench's settings: one optimizer step per batch of prompts x group, as alignflow's."""
    return GRPOConfig(
        **training_arguments(settings),
        per_device_train_batch_size=settings["prompts_per_step"] * settings["group_size"],
        steps_per_generation=1,
        num_iterations=1,
        num_generations=settings["group_size"],
        max_completion_length=settings["max_new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=settings["lr"],
        lr_scheduler_type="constant_with_warmup",  # constant at warmup_steps 0
        warmup_steps=settings["warmup_steps"],
        weight_decay=0.0,
        beta=settings["kl_coef"],
        epsilon=settings["clip_low"],
        epsilon_high=settings["clip_high"],
        loss_type="dapo",
        scale_rewards="group",
        reward_weights=[1.0, settings["format_weight"]],
        shuffle_dataset=settings.get("shuffle", True),  # False: alignflow's prompts, in its order
        use_vllm=False,
        remove_unused_columns=False,
        bf16=settings.get("bf16", False),  # on a CPU: the forward passes under bfloat16 autocast, fp32 weights
        logging_steps=1,
    )


def grpo_trainer(settings: dict, dataset: Dataset, tokenizer, model, timer: StepTimer):
    """TRL's GRPOTrainer on ``dataset`` with alignflow's rewards, timed by ``timer``, with LoRA adapters where the
    settings have them."""
    return GRPOTrainer(
        model=model,
        reward_funcs=[accuracy, format_reward],
        args=grpo_config(settings),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=peft_config(settings.get("lora")),
    )


def logged(trainer: GRPOTrainer, key: str) -> list[float]:
    """Every value of ``key`` in the trainer's log, a step each."""
    return [entry[key] for entry in trainer.state.log_history if key in entry]


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
    timer = StepTimer()
    trainer = grpo_trainer(settings, dataset, tokenizer, model, timer)
    check_prompt_ids(tokenizer, dataset, settings.get("expected_prompt_ids", []))
    trainer.train()
    save_trained(trainer, tokenizer, settings)
    completions = settings["prompts_per_step"] * settings["group_size"]
    with open(out, "w") as handle:
        measured = {"step_seconds": timer.seconds, "mean_lengths": logged(trainer, "completions/mean_length")}
        json.dump(measured | {"completions_per_step": completions}, handle)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
