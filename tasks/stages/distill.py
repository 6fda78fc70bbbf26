"""Stage `distill`: on-policy distillation of the student (``distill.init``) by the teacher (``distill.teacher``).

The RL trainer's loop (``tasks/rl/trainer.py``) with the student as the actor, the teacher a frozen role
(colocated, or on its own Ray actor with ``distill.roles.teacher``'s resources) and the distillation update of
``tasks/rl/distillation.py``; the loss is ``distill.distill_loss`` (``tasks/rl/distill_losses.py``).
"""

from models import load_tokenizer, vocabulary_mismatch
from tasks.common.config import ConfigError
from tasks.common.registry import StageRun
from tasks.data.prompts import PromptFormat
from tasks.rl import trainer as rl
from tasks.rl.distillation import distillation_learner


def run(stage: StageRun) -> None:
    cfg, inputs = stage.config, stage.inputs
    tokenizer = load_tokenizer(inputs["policy"])
    if (mismatch := vocabulary_mismatch(tokenizer, load_tokenizer(inputs["teacher"]))) is not None:
        raise ConfigError(
            f"distill.teacher: the tokenizer of {cfg.teacher} is not the student's (distill.init={cfg.init}): "
            f"{mismatch}"
        )
    teacher_data, prompt_format = inputs["teacher_data"] / "train.jsonl", PromptFormat.of(stage.params.task)
    learner = distillation_learner(cfg, teacher_data, tokenizer, prompt_format, stage.params.seed)
    train_file = inputs["data"] / "train.jsonl"
    rl.train(stage.params, cfg, stage.name, inputs["policy"], train_file, [], learner, inputs["teacher"])
