"""Stage `base`: the starting model in HF format, built tiny from params or taken from ``base.model_path`` (a model
directory, a GGUF file, or a package's file; ``models/sources.py``), with the source's sha256 beside it."""

import json

from models import build_char_tokenizer, build_tiny_llama
from models.sources import load_source, source_digest
from tasks.common.artifacts import atomic_output, model_dir
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live

SOURCE_FILE = "source.json"  # where the model came from, by name and content: dvc.lock hashes it with the model


def run(stage: StageRun) -> None:
    params, cfg = stage.params, stage.config
    if cfg.model_path is None:
        tokenizer = build_char_tokenizer()
        model, source = build_tiny_llama(cfg, tokenizer, params.seed), None
    else:
        # Loading (rather than copying files) proves the source is a usable model before anything is written.
        model, tokenizer = load_source(cfg.model_path)
        source = {"model_path": cfg.model_path, "sha256": source_digest(cfg.model_path)}
    with atomic_output(model_dir("base")) as out, stage_live("base") as live:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        if source is not None:
            (out / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
        live.log_metric("num_parameters", sum(p.numel() for p in model.parameters()), plot=False)
