"""Stages `base` and `agent_base`: the starting model in HF format, built tiny from params or taken from the
section's ``model_path`` (a model directory, a GGUF file, or a package's file; ``models/sources.py``), with the
source's sha256 beside it."""

import json
from pathlib import Path

from models import build_char_tokenizer, build_tiny_llama
from models.sources import ModelSourceError, load_source, source_digest, write_fingerprint
from tasks.common.artifacts import atomic_output, model_dir
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live

SOURCE_FILE = "source.json"  # the source's content hash, beside the model it gave


def run(stage: StageRun) -> None:
    params, cfg = stage.params, stage.config
    digest = None if cfg.model_path is None else source_digest(cfg.model_path)
    if cfg.model_path is None:
        tokenizer = build_char_tokenizer()
        model = build_tiny_llama(cfg, tokenizer, params.seed)
    else:
        # Loading (rather than copying files) proves the source is a usable model before anything is written.
        try:
            model, tokenizer = load_source(cfg.model_path)
        except ModelSourceError as error:
            raise ModelSourceError(f"{stage.kind.section}.model_path: {error}") from None
    # Under `dvc repro` DVC hashes the deps after the command: the lock records the source this run read.
    write_fingerprint(Path(stage.kind.fingerprint), digest)
    with atomic_output(model_dir(stage.name)) as out, stage_live(stage.name) as live:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        if digest is not None:
            (out / SOURCE_FILE).write_text(json.dumps({"sha256": digest}, indent=2) + "\n")
        live.log_metric("num_parameters", sum(p.numel() for p in model.parameters()), plot=False)
