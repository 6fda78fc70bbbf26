"""Stage `distill`: on-policy distillation of the student (``distill.init``) by the teacher (``distill.teacher``).

The RL trainer's loop (``tasks/rl/trainer.py``) with the student as the actor, the teacher a frozen role
(colocated, or on its own Ray actor with ``distill.roles.teacher``'s resources) and the distillation update of
``tasks/rl/distillation.py``; the loss is ``distill.distill_loss`` (``tasks/rl/distill_losses.py``).
"""

from models import load_tokenizer, vocabulary_mismatch
from tasks.common.artifacts import DATA_DIR, stage_dir, upstream_model
from tasks.common.config import ConfigError, Params
from tasks.rl import trainer as rl
from tasks.rl.distillation import distillation_learner


def run(params: Params) -> None:
    cfg = params.distill
    teacher, student = upstream_model(cfg.teacher), upstream_model(cfg.init)
    tokenizer = load_tokenizer(student)
    if (mismatch := vocabulary_mismatch(tokenizer, load_tokenizer(teacher))) is not None:
        raise ConfigError(
            f"distill.teacher: the tokenizer of {cfg.teacher} is not the student's (distill.init={cfg.init}): "
            f"{mismatch}"
        )
    learner = distillation_learner(cfg, stage_dir("teacher_data") / "train.jsonl", tokenizer, params.seed)
    rl.train(params, cfg, "distill", student, DATA_DIR / "train.jsonl", [], learner, teacher)
