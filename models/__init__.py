"""Building and loading models: the tiny base model, its tokenizer, the model sources and the roles stages load.

The names below load their module on first use, so reading ``models.sources`` (params validation does) imports
neither torch nor transformers.
"""

import importlib
from typing import Any

ALL_LINEAR = "all-linear"  # PEFT's name for every linear layer but the output head

_HOMES = {
    "context_length": "models.roles",
    "load_critic": "models.roles",
    "load_policy": "models.roles",
    "load_reference": "models.roles",
    "load_reward_model": "models.roles",
    "load_tokenizer": "models.roles",
    "num_parameters": "models.roles",
    "resolve_device": "models.roles",
    "vocabulary_mismatch": "models.roles",
    "student_of": "models.student",
    "build_tiny_llama": "models.tiny",
    "build_char_tokenizer": "models.tokenizer",
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
