"""The character tokenizer, the tiny model, and the roles loaded from an HF directory."""

import string

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models import (
    build_char_tokenizer,
    build_tiny_llama,
    load_critic,
    load_policy,
    load_reference,
    load_reward_model,
    load_tokenizer,
)
from tasks.common.config import BaseConfig
from tests.conftest import tiny_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny"))


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=string.digits + string.ascii_letters + "+-*/=(), :", max_size=40))
def test_tokenizer_round_trips_text_one_token_per_character(text):
    tokenizer = build_char_tokenizer()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(ids) == len(text)


def test_format_tags_are_single_tokens_and_bos_is_prepended():
    tokenizer = build_char_tokenizer()
    ids = tokenizer("1<think>2</think><answer>3</answer>")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 1 + 7


def test_saved_model_loads_through_from_pretrained_with_identical_outputs(model_dir):
    tokenizer = load_tokenizer(model_dir)
    assert tokenizer.decode(tokenizer("12+3=")["input_ids"], skip_special_tokens=True) == "12+3="
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file()
    first, second = load_policy(model_dir, CPU), load_policy(model_dir, CPU)
    ids = torch.tensor([tokenizer("12+3=")["input_ids"]])
    assert torch.equal(first(input_ids=ids).logits, second(input_ids=ids).logits)


def test_tiny_model_is_seeded():
    tokenizer = build_char_tokenizer()
    cfg = BaseConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    a, b, c = (build_tiny_llama(cfg, tokenizer, seed) for seed in (0, 0, 1))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_roles(model_dir):
    ids = torch.tensor([[1, 20, 21, 22, 0, 0]])
    mask = (ids != 0).long()
    reference = load_reference(model_dir, CPU)
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())
    critic = load_critic(model_dir, CPU)
    assert critic(input_ids=ids, attention_mask=mask).logits.shape == (1, 6, 1)
    assert any(p.requires_grad for p in critic.parameters())
    reward_model = load_reward_model(model_dir, CPU)
    assert reward_model(input_ids=ids, attention_mask=mask).logits.shape == (1, 1)
    # The backbone is the policy's: same embeddings after loading with a new head.
    assert torch.equal(reward_model.model.embed_tokens.weight, reference.model.embed_tokens.weight)
