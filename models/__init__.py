"""Building and loading models: the tiny base model, its tokenizer, and the roles stages load."""

from models.roles import (
    context_length,
    load_critic,
    load_policy,
    load_reference,
    load_reward_model,
    load_tokenizer,
    num_parameters,
    resolve_device,
    vocabulary_mismatch,
)
from models.tiny import build_tiny_llama
from models.tokenizer import build_char_tokenizer

__all__ = [
    "context_length",
    "build_char_tokenizer",
    "build_tiny_llama",
    "load_critic",
    "load_policy",
    "load_reference",
    "load_reward_model",
    "load_tokenizer",
    "num_parameters",
    "resolve_device",
    "vocabulary_mismatch",
]
