"""Stage `student_base`: the distillation student before training, smaller than the teacher, with its tokenizer.

A tiny Llama of ``student_base``'s size, built from the seed with the tokenizer of the teacher
(``distill.teacher``); or, with ``from_teacher``, the teacher itself with ``num_layers`` of its decoder layers; or
the model at ``student_base.model_path``, whose tokenizer must then be the teacher's: the teacher grades the student
token by token, so a token id must mean the same to both. It logs the student's ``num_parameters`` and its fraction
of the teacher's, and warns when it is not smaller.
"""

import torch

from models import (
    build_tiny_llama,
    load_policy,
    load_tokenizer,
    num_parameters,
    student_of,
    vocabulary_mismatch,
)
from tasks.common.artifacts import atomic_output, model_dir
from tasks.common.config import ConfigError
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live


def run(stage: StageRun) -> None:
    params, cfg, teacher = stage.params, stage.config, stage.inputs["teacher"]
    teacher_tokenizer = load_tokenizer(teacher)
    if cfg.from_teacher:
        tokenizer = teacher_tokenizer
        try:
            model = student_of(teacher, cfg.num_layers)
        except ValueError as error:
            raise ConfigError(f"student_base.num_layers: of the teacher's layers: {error}") from None
    elif cfg.model_path is None:
        tokenizer = teacher_tokenizer
        model = build_tiny_llama(cfg, tokenizer, params.seed)
    else:
        tokenizer = load_tokenizer(cfg.model_path)
        if (mismatch := vocabulary_mismatch(tokenizer, teacher_tokenizer)) is not None:
            raise ConfigError(
                f"student_base.model_path: the tokenizer of {cfg.model_path} is not the teacher's "
                f"(distill.teacher={params.distill.teacher}): {mismatch}"
            )
        model = load_policy(cfg.model_path, torch.device("cpu"))
    student_parameters = sum(p.numel() for p in model.parameters())
    fraction = student_parameters / num_parameters(teacher)
    if fraction >= 1:
        print(f"WARNING student_base: the student is not smaller than the teacher ({fraction:.2f} of it)", flush=True)
    with atomic_output(model_dir("student_base")) as out, stage_live("student_base") as live:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        live.log_metric("num_parameters", student_parameters, plot=False)
        live.log_metric("fraction_of_teacher", round(fraction, 4), plot=False)
