"""Stage `distill`: on-policy distillation of the student (``distill.init``) by the teacher (``distill.teacher``).

The RL trainer's loop (``tasks/rl/trainer.py``) with the student as the actor, the teacher a frozen role
(colocated, or on its own Ray actor with ``distill.roles.teacher``'s resources) and the distillation update of
``tasks/rl/distillation.py``; the loss is ``distill.loss`` (``tasks/rl/distill_losses.py``).
"""

from models import load_tokenizer, vocabulary_mismatch
from tasks.common.artifacts import DATA_DIR, stage_dir, upstream_model
from tasks.common.config import ConfigError, Params
from tasks.data.datasets import DatasetError, read_examples
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
    teacher_examples = []
    if cfg.lmbda < 1:
        source = stage_dir("teacher_data") / "train.jsonl"
        teacher_examples = read_examples(source)
        batch = cfg.rollout_batch_size * cfg.group_size
        if len(teacher_examples) < batch:
            raise DatasetError(
                f"{source}: {len(teacher_examples)} rows, fewer than a batch of distill.rollout_batch_size x "
                f"distill.group_size = {batch}, which distill.lmbda < 1 takes from it"
            )
    learner = distillation_learner(cfg, teacher_examples, tokenizer, params.seed)
    rl.train(params, cfg, "distill", student, DATA_DIR / "train.jsonl", [], learner, teacher)
