"""The rules of how stages train their models (``ModelTrainingConfig``: precision, gradient checkpointing, LoRA)
and sample with them (``InferenceConfig``'s precision) that no single field states: checked with the other
cross-field rules, before any stage runs."""

from __future__ import annotations

import functools
from collections.abc import Iterator

from models import ALL_LINEAR
from models.sources import gguf_architecture, resolve_source, source_error
from tasks.common.config import BaseConfig, InferenceConfig, ModelTrainingConfig, Params, RLConfig
from tasks.common.config.fields import schema_fields

PRECISE_SECTIONS = (ModelTrainingConfig, InferenceConfig)  # the sections with a precision


def training_errors(params: Params) -> Iterator[str]:
    for name, info in schema_fields(Params).items():
        if not (isinstance(info.annotation, type) and issubclass(info.annotation, PRECISE_SECTIONS)):
            continue
        cfg = getattr(params, name)
        if cfg.precision not in ("fp32", "auto") and not _device_runs_bf16(params.device):
            yield (
                f"{name}.precision: {cfg.precision} needs bfloat16, which this GPU lacks (compute capability < 8.0); "
                "fp32"
            )
        if isinstance(cfg, RLConfig) and cfg.vllm.dtype == "bf16" and not _device_runs_bf16(params.device):
            yield f"{name}.vllm.dtype: bf16 needs bfloat16, which this GPU lacks (compute capability < 8.0); fp32"
        if isinstance(cfg, ModelTrainingConfig):
            yield from _adapter_errors(name, cfg, params)


def _adapter_errors(name: str, cfg: ModelTrainingConfig, params: Params) -> Iterator[str]:
    if not cfg.lora.rank:
        return
    if cfg.parallel.strategy == "fsdp" and cfg.parallel.num_workers > 1:
        yield f"{name}.lora: adapters train on ddp workers (parallel.strategy: ddp), not sharded ones (fsdp)"
    if isinstance(cfg, RLConfig) and cfg.ref_reset_every is not None:
        yield (
            f"{name}.ref_reset_every: with lora the reference is the start, the policy with its adapters disabled; "
            f"null, got {cfg.ref_reset_every}"
        )
    if ALL_LINEAR in cfg.lora.target_modules:
        return
    layers = linear_layers(params.base)
    missing = [target for target in cfg.lora.target_modules if layers is not None and target not in layers]
    if missing:
        yield (
            f"{name}.lora.target_modules: the model has no layer {', '.join(map(repr, missing))} (its linear layers: "
            f"{', '.join(sorted(layers))}, or {ALL_LINEAR})"
        )


def runs_on_gpu(device: str) -> bool:
    """Whether params' ``device`` means a GPU: ``cuda``, or ``auto`` where one is visible."""
    import torch  # imported only when params are checked

    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def _device_runs_bf16(device: str) -> bool:
    import torch

    return not runs_on_gpu(device) or not torch.cuda.is_available() or torch.cuda.is_bf16_supported()


def linear_layers(base: BaseConfig) -> frozenset[str] | None:
    """The last part of the name of every linear layer of the base model (what ``lora.target_modules`` names),
    built on the meta device from its config, no weights read; None when that cannot be read from the source."""
    if base.model_path is not None and source_error(base.model_path) is not None:
        return None  # reported as base.model_path's own error
    return _linear_layers(base.model_path)


@functools.cache
def _linear_layers(model_path: str | None) -> frozenset[str] | None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    if model_path is None:  # the tiny built-in model is a Llama: its layers' names do not depend on its size
        config = LlamaConfig(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1)
    elif (path := resolve_source(model_path)).is_dir():
        config = AutoConfig.from_pretrained(path)
        config.num_hidden_layers = 1
    elif (architecture := gguf_architecture(path)) is not None:
        try:
            config = AutoConfig.for_model(architecture, num_hidden_layers=1)
        except ValueError:  # an architecture transformers names otherwise: the stage's own error will say
            return None
    else:
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return frozenset(
        name.rpartition(".")[2] for name, module in model.named_modules() if type(module).__name__ == "Linear"
    )
