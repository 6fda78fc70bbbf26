"""The built-in base model: a tiny Llama-family causal LM built from params, untrained."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase


def build_tiny_llama(cfg, tokenizer: PreTrainedTokenizerBase, seed: int) -> LlamaForCausalLM:
    """A randomly initialised Llama sized by ``cfg`` (a BaseConfig), its vocabulary that of ``tokenizer``."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        dtype="float32",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)
