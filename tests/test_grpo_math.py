"""Closed-form properties of the GRPO-family math in tasks/rl/core_algos.py: advantage estimators and policy losses."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.rl.core_algos import (
    ADVANTAGE_ESTIMATORS,
    GROUP_STD_EPS,
    POLICY_LOSSES,
    informative_groups,
    overlong_penalty,
    sequence_ratio,
)

F64 = torch.float64
GROUP_ESTIMATORS = [name for name, spec in ADVANTAGE_ESTIMATORS.items() if spec.compares_group]


def _rollout(seed: int, groups: int = 5, group_size: int = 4, width: int = 9):
    """Scores at each response's last token, right-padded responses, G consecutive rows per prompt."""
    generator = torch.Generator().manual_seed(seed)
    rows = groups * group_size
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    mask = (torch.arange(width) < lengths[:, None]).double()
    scores = torch.randn(rows, generator=generator, dtype=F64)
    token_rewards = torch.zeros(rows, width, dtype=F64)
    token_rewards[torch.arange(rows), lengths - 1] = scores
    return scores, token_rewards, mask, lengths


def _sequence_advantages(name: str, token_rewards, mask, group_size) -> torch.Tensor:
    advantages, _ = ADVANTAGE_ESTIMATORS[name](token_rewards, mask, group_size)
    return advantages[:, 0]


def test_the_registry_says_which_estimators_need_a_critic_or_groups():
    assert {name for name, spec in ADVANTAGE_ESTIMATORS.items() if spec.needs_critic} == {"gae"}
    assert set(GROUP_ESTIMATORS) == {"grpo", "dr_grpo", "rloo"}


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), group_size=st.integers(2, 8))
def test_grpo_advantages_have_mean_zero_and_std_one_in_every_group(seed, group_size):
    scores, token_rewards, mask, _ = _rollout(seed, group_size=group_size)
    groups = _sequence_advantages("grpo", token_rewards, mask, group_size).view(-1, group_size)
    assert torch.allclose(groups.mean(1), torch.zeros(len(groups), dtype=F64), atol=1e-9)
    # std 1, but for the epsilon that guards the division: exactly σ / (σ + ε)
    sigma = scores.view(-1, group_size).std(1, unbiased=False)
    assert torch.allclose(groups.std(1, unbiased=False), sigma / (sigma + GROUP_STD_EPS), atol=1e-9)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), scale=st.floats(0.01, 100.0), shift=st.floats(-100.0, 100.0))
def test_grpo_advantages_are_invariant_to_an_affine_reward_transform(seed, scale, shift):
    _, token_rewards, mask, lengths = _rollout(seed)
    transformed = token_rewards.clone()
    rows = torch.arange(len(lengths))
    transformed[rows, lengths - 1] = scale * token_rewards[rows, lengths - 1] + shift
    original = _sequence_advantages("grpo", token_rewards, mask, 4)
    # (r − μ)/(σ + ε) becomes (r − μ)/(σ + ε/a): off by at most |1 − 1/a|·ε/σ relative, σ the smallest group std
    smallest_std = (token_rewards * mask).sum(-1).view(-1, 4).std(1, unbiased=False).min().item()
    tolerance = 10 * GROUP_STD_EPS * abs(1 - 1 / scale) / smallest_std * original.abs().max().item() + 1e-9
    assert torch.allclose(_sequence_advantages("grpo", transformed, mask, 4), original, atol=tolerance)


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_an_all_equal_group_gets_zero_advantages_and_dynamic_sampling_drops_it(name):
    scores, token_rewards, mask, lengths = _rollout(1, groups=3, group_size=4)
    token_rewards[4:8] = 0.0
    token_rewards[torch.arange(4, 8), lengths[4:8] - 1] = 0.7  # group 1: four equal rewards
    advantages = _sequence_advantages(name, token_rewards, mask, 4)
    assert (advantages[4:8] == 0).all() and (advantages[:4] != 0).any()
    sequence_scores = (token_rewards * mask).sum(-1)
    assert informative_groups(sequence_scores, 4).tolist() == [True, False, True]


SEQUENCE_LEVEL = [
    name for name, spec in ADVANTAGE_ESTIMATORS.items() if not spec.needs_critic and name != "reinforce_pp"
]


@pytest.mark.parametrize("name", SEQUENCE_LEVEL)
def test_every_token_of_a_response_carries_the_responses_advantage(name):
    _, token_rewards, mask, lengths = _rollout(2)
    advantages, returns = ADVANTAGE_ESTIMATORS[name](token_rewards, mask, 4)
    assert returns is None
    for row, length in enumerate(lengths.tolist()):
        assert torch.all(advantages[row, :length] == advantages[row, 0])
        assert torch.all(advantages[row, length:] == 0)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_padding_gets_zero_advantage_under_every_estimator(name):
    _, token_rewards, mask, _ = _rollout(3)
    values = torch.randn_like(token_rewards)
    advantages, _ = ADVANTAGE_ESTIMATORS[name](token_rewards, mask, 4, values=values, gamma=0.99, lam=0.95)
    assert (advantages[mask == 0] == 0).all()


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), group_size=st.integers(2, 8))
def test_rloo_baseline_is_the_mean_of_the_other_responses(seed, group_size):
    scores, token_rewards, mask, _ = _rollout(seed, group_size=group_size)
    advantages = _sequence_advantages("rloo", token_rewards, mask, group_size)
    for row in range(len(scores)):
        start = row - row % group_size
        others = [scores[j].item() for j in range(start, start + group_size) if j != row]
        assert advantages[row].item() == pytest.approx(scores[row].item() - sum(others) / len(others), abs=1e-9)


def test_rloo_advantage_moves_one_for_one_with_its_own_reward():
    """The baseline excludes the sample itself: raising r_i by d raises A_i by exactly d."""
    _, token_rewards, mask, lengths = _rollout(4, group_size=3)
    bumped = token_rewards.clone()
    bumped[0, lengths[0] - 1] += 1.5
    before = _sequence_advantages("rloo", token_rewards, mask, 3)
    after = _sequence_advantages("rloo", bumped, mask, 3)
    assert (after[0] - before[0]).item() == pytest.approx(1.5)
    assert (after[1:3] - before[1:3]).tolist() == pytest.approx([-0.75, -0.75])


def test_dr_grpo_advantages_are_centred_but_not_scaled():
    scores, token_rewards, mask, _ = _rollout(5)
    groups = scores.view(-1, 4)
    expected = (groups - groups.mean(1, keepdim=True)).flatten()
    assert torch.allclose(_sequence_advantages("dr_grpo", token_rewards, mask, 4), expected, atol=1e-12)


def test_reinforce_pp_whitens_returns_over_the_batch():
    _, token_rewards, mask, _ = _rollout(6)
    advantages, _ = ADVANTAGE_ESTIMATORS["reinforce_pp"](token_rewards, mask, 4)
    real = advantages[mask.bool()]
    assert real.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert real.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)


def _ratio_batch(seed: int, rows: int = 4, width: int = 6):
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=generator, dtype=F64) * 3
    mask = (torch.arange(width) < torch.randint(1, width + 1, (rows,), generator=generator)[:, None]).double()
    return old, mask


def test_gspo_weight_is_one_at_the_old_policy():
    old, mask = _ratio_batch(0)
    assert torch.allclose(sequence_ratio(old, old, mask), torch.ones(4, dtype=F64))


@settings(max_examples=50, deadline=None)
@given(ratio=st.floats(0.2, 5.0), length=st.integers(1, 30))
def test_gspo_weight_equals_a_constant_per_token_ratio_whatever_the_length(ratio, length):
    old = torch.full((1, length), -1.3, dtype=F64)
    mask = torch.ones(1, length, dtype=F64)
    new = old + torch.log(torch.tensor(ratio, dtype=F64))
    assert sequence_ratio(new, old, mask).item() == pytest.approx(ratio, rel=1e-9)


def test_cispo_passes_gradient_to_tokens_whose_ratio_is_outside_the_clip_range():
    old = torch.full((1, 4), -1.0, dtype=F64)
    mask = torch.ones(1, 4, dtype=F64)
    # ratios 1.6 and 0.5 are outside [0.8, 1.28], on the side where PPO's clip stops the gradient
    ratios = torch.tensor([[1.6, 1.0, 1.1, 0.5]], dtype=F64)
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=F64)
    gradients = {}
    for name in ("cispo", "token_mean"):
        logprobs = (old + torch.log(ratios)).requires_grad_()
        loss, clip_fraction = POLICY_LOSSES[name](logprobs, old, advantages, mask, eps_low=0.2, eps_high=0.28)
        loss.backward()
        gradients[name] = logprobs.grad[0]
        assert clip_fraction.item() == pytest.approx(0.5)
    assert (gradients["cispo"] != 0).all()
    assert gradients["token_mean"][0] == 0 and gradients["token_mean"][3] == 0


def test_loss_normalisations_differ_only_in_how_they_average():
    old, mask = _ratio_batch(1)
    advantages = torch.randn(4, 6, dtype=F64) * mask
    args = dict(eps_low=0.2, eps_high=0.2, max_length=10)
    terms = -advantages  # at ρ = 1 every clipped term is −Â
    token = POLICY_LOSSES["token_mean"](old, old, advantages, mask, **args)[0]
    sequence = POLICY_LOSSES["seq_mean"](old, old, advantages, mask, **args)[0]
    constant = POLICY_LOSSES["dr_grpo"](old, old, advantages, mask, **args)[0]
    assert token.item() == pytest.approx(((terms * mask).sum() / mask.sum()).item())
    assert sequence.item() == pytest.approx(((terms * mask).sum(-1) / mask.sum(-1)).mean().item())
    assert constant.item() == pytest.approx(((terms * mask).sum() / (4 * 10)).item())


def test_overlong_penalty_is_zero_then_linear_then_minus_one():
    lengths = torch.tensor([10, 48, 56, 64, 64])
    truncated = torch.tensor([False, False, False, False, True])
    penalty = overlong_penalty(lengths, truncated, max_length=64, buffer=16)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
