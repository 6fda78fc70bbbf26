"""A model as a stage trains it: in its precision, with gradient checkpointing, through LoRA adapters (PEFT).

- ``precision``: fp32 (float32 weights and math: the default, and what keeps the tiny model's runs bit-exact);
  bf16 (bfloat16 weights and math); bf16-mixed (float32 weights and optimiser, the forward passes under bfloat16
  autocast); auto (bf16-mixed where the device computes bfloat16 natively, else fp32: ``resolved_precision``,
  applied to every section when a stage starts). The frozen roles (reference, reward model, teacher) and the
  rollout engines compute in the precision's compute dtype (``compute_dtype``), vLLM included.
- ``lora.rank`` > 0: the model's weights stay frozen and rank-r adapters on ``lora.target_modules`` train (a
  classification head, which the base model lacks, trains whole). The reference of an adapted policy is the same
  model with its adapters disabled, not a second copy; what the stage writes is the merged model, which
  ``transformers`` and vLLM load, with the adapter beside it in ``adapter/``; the engines take merged weights.
"""

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from models import ALL_LINEAR

ADAPTER_DIR = "adapter"  # beside the merged model: the adapter alone, loadable with peft onto the stage's init
COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "bf16-mixed": torch.bfloat16}
WEIGHT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "bf16-mixed": torch.float32}
_HEADS = ("score", "classifier")  # a classification head the base model lacks: trained whole, not adapted


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 matmuls natively: a CUDA GPU of compute capability 8.0 or more, or a CPU
    with AMX or AVX-512 BF16 (a CPU without them runs them tens of times slower than float32: docs/real-models.md)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().split()) if cpuinfo.is_file() else set()
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def resolved_precision(precision: str, device: torch.device, bf16: str) -> str:
    """``precision`` with ``auto`` made ``bf16`` (a training stage's bf16-mixed, a sampling stage's bf16) where the
    device computes bfloat16 natively, else fp32."""
    if precision != "auto":
        return precision
    return bf16 if native_bf16(device) else "fp32"


def compute_dtype(precision: str) -> torch.dtype:
    return COMPUTE_DTYPES[precision]


def weights_dtype(precision: str) -> torch.dtype:
    return WEIGHT_DTYPES[precision]


def prepared_for_training(model: PreTrainedModel, cfg: Any) -> PreTrainedModel:
    """``model`` (loaded in ``weights_dtype(cfg.precision)``) with gradient checkpointing and LoRA adapters as the
    stage's config ``cfg`` asks (its ``gradient_checkpointing`` and ``lora``)."""
    if cfg.gradient_checkpointing:
        # non-reentrant: gradients reach the adapters though the checkpointed blocks' inputs need none
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if not cfg.lora.rank:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=ALL_LINEAR if ALL_LINEAR in cfg.lora.target_modules else list(cfg.lora.target_modules),
        modules_to_save=[head for head in _HEADS if hasattr(model, head)] or None,
    )
    return get_peft_model(model, config)


def trainable_policy(path: Path, device: torch.device, cfg: Any) -> PreTrainedModel:
    """The causal LM in ``path`` on ``device``, ready to train as ``cfg`` says (``prepared_for_training``)."""
    from models.roles import load_policy

    return prepared_for_training(load_policy(path, device, weights_dtype(cfg.precision)), cfg)


def is_adapted(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def autocast(model: torch.nn.Module, precision: str) -> contextlib.AbstractContextManager:
    """Around a forward pass: bfloat16 autocast on the model's device for a mixed precision, else nothing."""
    if not precision.endswith("-mixed"):
        return contextlib.nullcontext()
    device = next(model.parameters()).device
    return torch.autocast(device.type, dtype=compute_dtype(precision))


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The base model inside (an adapted model's reference); a model without adapters is its own."""
    with model.disable_adapter() if is_adapted(model) else contextlib.nullcontext():
        yield


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights with its adapters folded in, by the plain model's names (what ``save_pretrained`` and
    the engines take); the model itself is left as it is. A model without adapters: its own state dict."""
    if not is_adapted(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base, adapter = model.get_base_model(), model.active_adapter
    deltas = {
        f"{name}.base_layer.weight": module.get_delta_weight(adapter)
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer) and adapter in module.lora_A
    }
    merged = {}
    for name, tensor in base.state_dict().items():
        if "lora_" in name or ".original_module." in name:
            continue
        if name in deltas:
            tensor = tensor + deltas[name].to(tensor.dtype)
        merged[name.replace(".base_layer.", ".").replace(f".modules_to_save.{adapter}.", ".")] = tensor.detach()
    return merged


def save_model(model: torch.nn.Module, out: Path, weights: dict[str, torch.Tensor] | None = None) -> None:
    """Write ``model`` to ``out`` as a plain model directory: merged when it has adapters (its adapter alone goes
    to ``out/adapter``). ``weights``: its state dict gathered from the ranks that shard it, when they do."""
    if not is_adapted(model):
        model.save_pretrained(out, state_dict=weights)
        return
    model.get_base_model().save_pretrained(out, state_dict=merged_state_dict(model))
    for config in model.peft_config.values():
        config.base_model_name_or_path = None  # a path of this machine: the merged model beside it is the base
    model.save_pretrained(out / ADAPTER_DIR)
