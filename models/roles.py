"""Load a Hugging Face model directory in the role a stage needs.

Every role goes through ``from_pretrained``, so the built-in tiny model and a
real checkpoint take the same path:

- policy: the causal LM being trained;
- reference: the same weights, frozen (KL anchor);
- critic: the backbone with a per-token scalar head (``ForTokenClassification``, one label);
- reward model: the backbone with a sequence scalar head read at the last
  non-pad token (``ForSequenceClassification``, one label).

Heads the checkpoint lacks are freshly initialised; all of them save and load in
HF format, so a trained reward model or critic is itself a model directory.
"""

from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)


def resolve_device(name: str) -> torch.device:
    """'auto' means cuda when available; asking for cuda without one is an error, not a silent fallback."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: 'cuda' requested but no GPU is visible")
    return torch.device(name)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def vocabulary_mismatch(student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase) -> str | None:
    """How two tokenizers differ in what distillation compares (token ids and the special tokens), or None when
    they are the same: a teacher grades a student token by token, so an id must mean the same token to both."""
    student_vocab, teacher_vocab = student.get_vocab(), teacher.get_vocab()
    if student_vocab != teacher_vocab:
        differing = sorted(set(student_vocab.items()) ^ set(teacher_vocab.items()), key=str)
        return (
            f"{len(student_vocab)} tokens against the teacher's {len(teacher_vocab)}; first difference: "
            f"{differing[0][0]!r}"
        )
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(student, name) != getattr(teacher, name):
            return f"{name} {getattr(student, name)} against the teacher's {getattr(teacher, name)}"
    return None


def context_length(path: str | Path) -> int:
    """The longest sequence the model in ``path`` attends over (its position embeddings)."""
    return AutoConfig.from_pretrained(path).max_position_embeddings


def num_parameters(path: str | Path) -> int:
    """The parameters of the causal LM in ``path``, counted on the meta device (no weights are read)."""
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).parameters())


def load_policy(path: str | Path, device: torch.device, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)


def load_reference(path: str | Path, device: torch.device, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    return _frozen(load_policy(path, device, dtype))


def load_critic(path: str | Path, device: torch.device, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    # No dropout before the value head (transformers' default is 0.1): the values that feed GAE and the value
    # clip must be the ones the update regresses, not a fresh random mask each pass.
    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0
    return AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=dtype).to(device)


def load_reward_model(
    path: str | Path, device: torch.device, trainable: bool = False, dtype: torch.dtype = torch.float32
) -> PreTrainedModel:
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=dtype).to(device)
    return model if trainable else _frozen(model)


def _frozen(model: PreTrainedModel) -> PreTrainedModel:
    model.eval()
    model.requires_grad_(False)
    return model
