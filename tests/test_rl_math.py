"""Closed-form properties of the RLHF math in tasks/rl/core_algos.py."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.algos.reward_models import best_of_n_expectation, best_of_n_kl
from tasks.algos.supervised import bradley_terry_loss
from tasks.algos.tokens import entropy_from_logits, whiten
from tasks.rl.core_algos import KL_ESTIMATORS, agg_loss, clipped_value_loss, gae, kl_k1, ppo_surrogate, shaped_rewards

F64 = torch.float64  # closed forms are checked to 1e-9: compute in double precision


def _batch(seed: int, rows: int = 4, width: int = 7):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    mask = (torch.arange(width) < lengths[:, None]).double()
    rewards = torch.randn(rows, width, generator=generator, dtype=F64) * mask
    values = torch.randn(rows, width, generator=generator, dtype=F64)
    return rewards, values, mask, lengths


def _discounted_return(rewards: torch.Tensor, length: int, t: int, gamma: float) -> float:
    return sum(gamma ** (k - t) * rewards[k].item() for k in range(t, length))


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), gamma=st.floats(0.5, 1.0))
def test_gae_with_lambda_one_is_monte_carlo_return_minus_value(seed, gamma):
    rewards, values, mask, lengths = _batch(seed)
    advantages, returns = gae(rewards, values, mask, gamma, lam=1.0)
    for row, length in enumerate(lengths.tolist()):
        for t in range(length):
            expected = _discounted_return(rewards[row], length, t, gamma) - values[row, t].item()
            assert advantages[row, t].item() == pytest.approx(expected, abs=1e-9)
            assert returns[row, t].item() == pytest.approx(_discounted_return(rewards[row], length, t, gamma))


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), gamma=st.floats(0.5, 1.0))
def test_gae_with_lambda_zero_is_the_td_error(seed, gamma):
    rewards, values, mask, lengths = _batch(seed)
    advantages, _ = gae(rewards, values, mask, gamma, lam=0.0)
    for row, length in enumerate(lengths.tolist()):
        for t in range(length):
            next_value = values[row, t + 1].item() if t + 1 < length else 0.0
            expected = rewards[row, t].item() + gamma * next_value - values[row, t].item()
            assert advantages[row, t].item() == pytest.approx(expected, abs=1e-9)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), gamma=st.floats(0.5, 1.0), lam=st.floats(0.0, 1.0))
def test_gae_recursion_equals_the_closed_form_sum_of_discounted_td_errors(seed, gamma, lam):
    rewards, values, mask, lengths = _batch(seed)
    advantages, _ = gae(rewards, values, mask, gamma, lam)
    for row, length in enumerate(lengths.tolist()):
        v = [*values[row, :length].tolist(), 0.0]
        deltas = [rewards[row, t].item() + gamma * v[t + 1] - v[t] for t in range(length)]
        for t in range(length):
            expected = sum((gamma * lam) ** (k - t) * deltas[k] for k in range(t, length))
            assert advantages[row, t].item() == pytest.approx(expected, abs=1e-9)


def test_padding_gets_zero_advantage_and_moves_no_loss():
    rewards, values, mask, _ = _batch(3, rows=6, width=9)
    advantages, returns = gae(rewards, values, mask, 0.99, 0.95)
    assert (advantages[mask == 0] == 0).all() and (returns[mask == 0] == 0).all()
    assert (whiten(advantages, mask)[mask == 0] == 0).all()

    def losses(logprobs, new_values):
        policy = agg_loss(ppo_surrogate(logprobs, old_logprobs, advantages, mask, 0.2, 0.28)[0], mask, "token_mean")
        return policy, clipped_value_loss(new_values, values, returns, mask, 0.2)

    old_logprobs = -torch.rand(6, 9, dtype=F64)
    logprobs = (old_logprobs + 0.1 * torch.randn(6, 9, dtype=F64)).requires_grad_()
    new_values = (values + 0.1 * torch.randn(6, 9, dtype=F64)).requires_grad_()
    policy, value = losses(logprobs, new_values)
    (policy + value).backward()
    assert (logprobs.grad[mask == 0] == 0).all() and (new_values.grad[mask == 0] == 0).all()
    # Garbage in the padding changes nothing.
    noisy = torch.where(mask == 0, torch.full_like(logprobs, 1e3), logprobs.detach())
    assert torch.allclose(torch.stack(losses(noisy, new_values.detach())), torch.stack([policy, value]).detach())


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), beta=st.floats(0.0, 1.0))
def test_shaped_rewards_sum_to_score_minus_beta_times_log_ratio(seed, beta):
    _, _, mask, _ = _batch(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    logprobs, ref_logprobs = -torch.rand(2, *mask.shape, generator=generator, dtype=F64)
    scores = torch.randn(len(mask), generator=generator, dtype=F64)
    rewards = shaped_rewards(scores, mask, beta * kl_k1(logprobs, ref_logprobs))
    expected = scores - beta * ((logprobs - ref_logprobs) * mask).sum(-1)
    assert torch.allclose(rewards.sum(-1), expected)
    assert (rewards[mask == 0] == 0).all()


def test_shaped_rewards_at_initialisation_are_the_score_at_the_last_token_only():
    _, _, mask, lengths = _batch(5)
    logprobs = -torch.rand(mask.shape, dtype=F64)
    scores = torch.tensor([0.5, -1.0, 2.0, 0.25], dtype=F64)
    rewards = shaped_rewards(scores, mask, 0.1 * kl_k1(logprobs, logprobs.clone()))
    expected = torch.zeros_like(rewards)
    expected[torch.arange(4), lengths - 1] = scores
    assert torch.equal(rewards, expected)


@settings(max_examples=300, deadline=None)
@given(
    advantage=st.floats(-3, 3).filter(lambda a: abs(a) > 1e-3),
    log_ratio=st.floats(-1, 1).filter(lambda r: abs(r) > 1e-3),
    eps_low=st.floats(0.05, 0.3),
    eps_high=st.floats(0.05, 0.4),
)
def test_clipped_loss_gradient_vanishes_exactly_where_the_clip_binds(advantage, log_ratio, eps_low, eps_high):
    ratio = math.exp(log_ratio)
    if min(abs(ratio - (1 + eps_high)), abs(ratio - (1 - eps_low))) < 1e-6:
        return  # on the clip boundary the gradient is one-sided
    logprobs = torch.tensor([[log_ratio]], requires_grad=True)
    mask = torch.ones(1, 1)
    losses, _ = ppo_surrogate(logprobs, torch.zeros(1, 1), torch.tensor([[advantage]]), mask, eps_low, eps_high)
    loss = agg_loss(losses, mask, "token_mean")
    loss.backward()
    clipped = (advantage > 0 and ratio > 1 + eps_high) or (advantage < 0 and ratio < 1 - eps_low)
    assert (logprobs.grad.item() == 0) == clipped


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), size=st.integers(2, 6))
def test_kl_estimators_under_exact_enumeration(seed, size):
    generator = torch.Generator().manual_seed(seed)
    policy = torch.softmax(torch.randn(size, generator=generator, dtype=F64), 0)
    reference = torch.softmax(torch.randn(size, generator=generator, dtype=F64), 0)
    true_kl = (policy * (policy.log() - reference.log())).sum()
    expectation = {name: (policy * kl(policy.log(), reference.log())).sum() for name, kl in KL_ESTIMATORS.items()}
    assert expectation["k1"].item() == pytest.approx(true_kl.item(), abs=1e-12)
    assert expectation["k3"].item() == pytest.approx(true_kl.item(), abs=1e-12)
    assert (KL_ESTIMATORS["k3"](policy.log(), reference.log()) >= 0).all()
    for kl in KL_ESTIMATORS.values():
        assert torch.allclose(kl(policy.log(), policy.log()), torch.zeros(size, dtype=F64))


def test_k2_is_biased():
    policy, reference = torch.tensor([0.9, 0.1]), torch.tensor([0.2, 0.8])
    true_kl = (policy * (policy.log() - reference.log())).sum()
    k2 = (policy * KL_ESTIMATORS["k2"](policy.log(), reference.log())).sum()
    assert abs(k2 - true_kl) > 0.05  # 0.0885 here


@settings(max_examples=100, deadline=None)
@given(chosen=st.lists(st.floats(-5, 5), min_size=1, max_size=8), shift=st.floats(-10, 10))
def test_bradley_terry_loss_is_log_two_at_ties_and_shift_invariant(chosen, shift):
    chosen = torch.tensor(chosen, dtype=F64)
    assert bradley_terry_loss(chosen, chosen).item() == pytest.approx(math.log(2))
    rejected = chosen.flip(0)
    assert bradley_terry_loss(chosen + shift, rejected + shift).item() == pytest.approx(
        bradley_terry_loss(chosen, rejected).item(), abs=1e-9
    )


def test_entropy_is_log_vocabulary_for_uniform_and_zero_for_one_hot():
    assert entropy_from_logits(torch.zeros(1, 1, 5)).item() == pytest.approx(math.log(5))
    assert entropy_from_logits(torch.tensor([[[0.0, -1e4, -1e4]]])).item() == pytest.approx(0, abs=1e-6)


def test_whitened_values_have_zero_mean_and_unit_variance_over_real_tokens():
    _, values, mask, _ = _batch(7, rows=8, width=10)
    white = whiten(values, mask)
    real = white[mask == 1]
    assert real.mean().item() == pytest.approx(0, abs=1e-9)
    assert real.var(unbiased=False).item() == pytest.approx(1, abs=1e-6)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), samples=st.integers(1, 7), ties=st.booleans())
def test_best_of_n_expectation_is_the_mean_over_every_n_subset(seed, samples, ties):
    """Against enumeration: each n-subset of a prompt's samples keeps its highest-proxy member (the first, on a tie)."""
    generator = torch.Generator().manual_seed(seed)
    proxy = torch.randn(3, samples, generator=generator, dtype=F64)
    if ties:
        proxy = proxy.round()
    values = torch.randn(3, samples, generator=generator, dtype=F64)
    for n in range(1, samples + 1):
        expected = []
        for row in range(3):
            kept = []
            for subset in itertools.combinations(range(samples), n):
                ranked = sorted(subset, key=lambda i: (proxy[row, i].item(), i))  # ascending, stable: last wins
                kept.append(values[row, ranked[-1]].item())
            expected.append(sum(kept) / len(kept))
        torch.testing.assert_close(best_of_n_expectation(proxy, values, n), torch.tensor(expected, dtype=F64))


def test_best_of_n_ends_at_the_mean_and_the_proxys_favourite():
    proxy, values = torch.tensor([[0.3, 2.0, -1.0, 0.7]]), torch.tensor([[1.0, 5.0, 3.0, 7.0]])
    assert best_of_n_expectation(proxy, values, 1).item() == pytest.approx(4.0)
    assert best_of_n_expectation(proxy, values, 4).item() == pytest.approx(5.0)
    assert best_of_n_expectation(values, values, 2).item() >= best_of_n_expectation(proxy, values, 2).item()


def test_best_of_n_kl_closed_form():
    assert best_of_n_kl(1) == 0.0
    assert best_of_n_kl(2) == pytest.approx(math.log(2) - 0.5)
    assert best_of_n_kl(64) == pytest.approx(math.log(64) - 63 / 64)
    assert all(best_of_n_kl(n) < best_of_n_kl(n + 1) < math.log(n + 1) for n in range(1, 100))
