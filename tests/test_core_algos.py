"""Closed-form checks of the shared pure math in tasks/algos (token log-probs, SFT loss, pass@k)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.algos.supervised import pass_at_k, sft_loss
from tasks.algos.tokens import masked_mean, token_logprobs


def test_sft_loss_is_cross_entropy_over_response_tokens_only():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11)
    input_ids = torch.randint(0, 11, (3, 7))
    loss_mask = torch.zeros(3, 7)
    loss_mask[0, 3:] = 1
    loss_mask[1, 2:5] = 1
    loss_mask[2, 6:] = 1
    labels = input_ids.masked_fill(loss_mask == 0, -100)[:, 1:]
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 11), labels.reshape(-1), ignore_index=-100)
    assert torch.allclose(sft_loss(logits, input_ids, loss_mask), expected, atol=1e-6)


def test_sft_loss_ignores_prompt_and_padding_logits():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 5, requires_grad=True)
    input_ids = torch.randint(0, 5, (2, 6))
    loss_mask = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]], dtype=torch.float)
    sft_loss(logits, input_ids, loss_mask).backward()
    # Logit t predicts token t+1: only positions whose next token is in the mask get gradient.
    predicts_response = loss_mask[:, 1:].bool()
    assert (logits.grad[:, :-1][~predicts_response] == 0).all()
    assert (logits.grad[:, :-1][predicts_response].abs().sum(-1) > 0).all()
    assert (logits.grad[:, -1] == 0).all()


def test_token_logprobs_are_normalised():
    logits = torch.randn(2, 3, 4)
    total = sum(token_logprobs(logits, torch.full((2, 3), v)).exp() for v in range(4))
    assert torch.allclose(total, torch.ones(2, 3))


def test_masked_mean_matches_mean_of_selected_and_is_zero_when_empty():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    assert masked_mean(values, mask).item() == pytest.approx((1 + 3 + 6) / 3)
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 30), data=st.data())
def test_pass_at_k_equals_the_combinatorial_closed_form(n, data):
    k = data.draw(st.integers(1, n))
    c = data.draw(st.integers(0, n))
    expected = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert math.isclose(pass_at_k(n, torch.tensor([c]), k).item(), expected, abs_tol=1e-9)


def test_pass_at_k_edge_cases():
    assert pass_at_k(8, torch.tensor([0, 8]), 8).tolist() == [0.0, 1.0]
    assert torch.allclose(pass_at_k(10, torch.tensor([3]), 1), torch.tensor([0.3], dtype=torch.float64))
