"""Stage `base`: the starting model in HF format, built tiny from params or taken from a model path."""

import torch

from models import build_char_tokenizer, build_tiny_llama, load_policy, load_tokenizer
from tasks.common.artifacts import atomic_output, model_dir
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live


def run(stage: StageRun) -> None:
    params, cfg = stage.params, stage.config
    if cfg.model_path is None:
        tokenizer = build_char_tokenizer()
        model = build_tiny_llama(cfg, tokenizer, params.seed)
    else:
        # Loading (rather than copying files) proves the directory is a usable model before anything is written.
        tokenizer = load_tokenizer(cfg.model_path)
        model = load_policy(cfg.model_path, torch.device("cpu"))
    with atomic_output(model_dir("base")) as out, stage_live("base") as live:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        live.log_metric("num_parameters", sum(p.numel() for p in model.parameters()), plot=False)
