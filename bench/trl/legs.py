"""What the TRL legs of the benches share: the wall time of every optimizer step, from a trainer callback, and the
LoRA config of a leg that trains adapters."""

import time

from transformers import TrainerCallback


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (with whatever the trainer does inside it: generation, reference passes)."""

    def __init__(self):
        self.seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self.started)


def peft_config(lora: dict | None):
    """PEFT's LoraConfig of alignflow's ``lora`` section (rank, alpha, dropout, target_modules); None: no adapters."""
    if not lora:
        return None
    from peft import LoraConfig

    targets = lora["target_modules"]
    return LoraConfig(
        r=lora["rank"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules="all-linear" if "all-linear" in targets else list(targets),
    )


def training_arguments(settings: dict) -> dict:
    """The trainer arguments every TRL leg sets alike: ``settings``' steps, seed, device and gradient
    checkpointing; one optimizer step per batch, the gradient norm clipped to 1, nothing saved, logged or shown
    on the way (the bench saves the final model and times the steps itself)."""
    return {
        "output_dir": settings["output_dir"],
        "max_steps": settings["steps"],
        "gradient_accumulation_steps": 1,
        "max_grad_norm": 1.0,
        "use_cpu": settings.get("device", "cpu") == "cpu",
        "seed": settings["seed"],
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "gradient_checkpointing": settings["gradient_checkpointing"],
    }


def save_trained(trainer, tokenizer, settings: dict) -> None:
    """The trained model (merged, where it trained LoRA adapters) and its tokenizer, to the settings' output_dir."""
    if settings.get("lora"):
        trainer.model.merge_and_unload().save_pretrained(settings["output_dir"])
    else:
        trainer.save_model(settings["output_dir"])
    tokenizer.save_pretrained(settings["output_dir"])
