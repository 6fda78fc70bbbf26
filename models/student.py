"""A distillation student made from its teacher: a subset of the teacher's decoder layers (DistilBERT's recipe)."""

from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

from models.roles import load_policy


def kept_layers(num_teacher_layers: int, num_layers: int) -> list[int]:
    """``num_layers`` indices out of ``range(num_teacher_layers)``, evenly spaced, the first and the last kept."""
    if not 1 <= num_layers <= num_teacher_layers:
        raise ValueError(f"num_layers must be in 1..{num_teacher_layers}, got {num_layers}")
    if num_layers == 1:
        return [0]
    step = (num_teacher_layers - 1) / (num_layers - 1)
    return [round(i * step) for i in range(num_layers)]


def student_of(teacher: str | Path, num_layers: int) -> PreTrainedModel:
    """The teacher with only ``kept_layers`` of its decoder layers, each keeping its weights: the embeddings, the
    final norm and the head are the teacher's, so the student starts as a shallower copy, not from noise."""
    model = load_policy(teacher, torch.device("cpu"))
    return with_layers(model, kept_layers(len(model.get_decoder().layers), num_layers))


def with_layers(model: PreTrainedModel, keep: list[int]) -> PreTrainedModel:
    """``model`` cut, in place, to the decoder layers ``keep``, its config saying so."""
    decoder = model.get_decoder()
    decoder.layers = nn.ModuleList(decoder.layers[i] for i in keep)
    for position, layer in enumerate(decoder.layers):
        # the KV cache indexes layers by this position
        layer.self_attn.layer_idx = position
    config = model.config
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[i] for i in keep]
    config.num_hidden_layers = len(keep)
    return model
