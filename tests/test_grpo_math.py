"""Closed-form properties of the GRPO-family math in tasks/rl/core_algos.py: advantage estimators and policy losses."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.algos.tokens import masked_mean
from tasks.rl.core_algos import (
    ADVANTAGE_ESTIMATORS,
    GROUP_STD_EPS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    agg_loss,
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
    for name in ("cispo", "ppo"):
        logprobs = (old + torch.log(ratios)).requires_grad_()
        losses, clipped = POLICY_LOSSES[name](logprobs, old, advantages, mask, eps_low=0.2, eps_high=0.28)
        agg_loss(losses, mask, "token_mean").backward()
        gradients[name] = logprobs.grad[0]
        assert masked_mean(clipped, mask).item() == pytest.approx(0.5)
    assert (gradients["cispo"] != 0).all()
    assert gradients["ppo"][0] == 0 and gradients["ppo"][3] == 0


def test_loss_normalisations_differ_only_in_how_they_average():
    old, mask = _ratio_batch(1)
    advantages = torch.randn(4, 6, dtype=F64) * mask
    terms = -advantages  # at ρ = 1 every clipped term is −Â
    losses, _ = POLICY_LOSSES["ppo"](old, old, advantages, mask, eps_low=0.2, eps_high=0.2)
    token = agg_loss(losses, mask, "token_mean", max_length=10)
    sequence = agg_loss(losses, mask, "seq_mean_token_mean", max_length=10)
    constant = agg_loss(losses, mask, "seq_mean_token_sum_norm", max_length=10)
    assert token.item() == pytest.approx(((terms * mask).sum() / mask.sum()).item())
    assert sequence.item() == pytest.approx(((terms * mask).sum(-1) / mask.sum(-1)).mean().item())
    assert constant.item() == pytest.approx(((terms * mask).sum() / (4 * 10)).item())


# --- The policy losses as they were before a surrogate and its aggregation were separate knobs (five registered
# losses, each with its aggregation built in): the reference every (surrogate, mode) pair that replaced one must
# reproduce, value and gradient.


def _old_clipped_terms(logprobs, old_logprobs, advantages, mask, eps_low, eps_high):
    ratio = torch.exp(torch.where(mask.bool(), logprobs - old_logprobs, 0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_low, 1 + eps_high)
    return torch.maximum(unclipped, clipped)


def _old_token_mean(logprobs, old_logprobs, advantages, mask, eps_low, eps_high, max_length):
    terms = _old_clipped_terms(logprobs, old_logprobs, advantages, mask, eps_low, eps_high)
    return torch.where(mask.bool(), terms, 0).sum() / mask.sum().clamp(min=1)


def _old_seq_mean(logprobs, old_logprobs, advantages, mask, eps_low, eps_high, max_length):
    terms = _old_clipped_terms(logprobs, old_logprobs, advantages, mask, eps_low, eps_high)
    return ((terms * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def _old_dr_grpo(logprobs, old_logprobs, advantages, mask, eps_low, eps_high, max_length):
    terms = _old_clipped_terms(logprobs, old_logprobs, advantages, mask, eps_low, eps_high)
    return (terms * mask).sum() / (mask.shape[0] * max_length)


def _old_gspo(logprobs, old_logprobs, advantages, mask, eps_low, eps_high, max_length):
    log_ratio = torch.where(mask.bool(), logprobs - old_logprobs, 0).sum(-1) / mask.sum(-1).clamp(min=1)
    ratio = torch.exp(log_ratio)
    sequence_advantages = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    unclipped = -sequence_advantages * ratio
    clipped = -sequence_advantages * ratio.clamp(1 - eps_low, 1 + eps_high)
    return torch.maximum(unclipped, clipped).mean()


def _old_cispo(logprobs, old_logprobs, advantages, mask, eps_low, eps_high, max_length):
    ratio = torch.exp(torch.where(mask.bool(), logprobs - old_logprobs, 0))
    weight = ratio.clamp(1 - eps_low, 1 + eps_high).detach()
    losses = -weight * advantages * logprobs
    return torch.where(mask.bool(), losses, 0).sum() / mask.sum().clamp(min=1)


# (surrogate, mode) -> the old loss it replaces, and whether it is the same to the bit (gspo's per-response loss is
# now spread over the response's tokens and averaged back: the same to round-off)
OLD_LOSSES = {
    ("ppo", "token_mean"): (_old_token_mean, True),
    ("ppo", "seq_mean_token_mean"): (_old_seq_mean, True),
    ("ppo", "seq_mean_token_sum_norm"): (_old_dr_grpo, True),
    ("gspo", "seq_mean_token_mean"): (_old_gspo, False),
    ("cispo", "token_mean"): (_old_cispo, True),
}


def _policy_batch(seed: int, dtype=torch.float32, rows: int = 6, width: int = 9):
    """Log-probs a step apart from π_old's (some ratios past the clip), token-varying advantages, ragged rows."""
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=generator, dtype=dtype) * 3
    logprobs = old + 0.3 * torch.randn(rows, width, generator=generator, dtype=dtype)
    advantages = torch.randn(rows, width, generator=generator, dtype=dtype)
    mask = (torch.arange(width) < torch.randint(1, width + 1, (rows,), generator=generator)[:, None]).to(dtype)
    return logprobs, old, advantages * mask, mask


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), eps_low=st.floats(0.05, 0.3), eps_high=st.floats(0.05, 0.4))
@pytest.mark.parametrize(("surrogate", "mode"), list(OLD_LOSSES))
def test_each_surrogate_and_mode_is_the_old_loss_it_replaces(surrogate, mode, seed, eps_low, eps_high):
    old_loss, bitwise = OLD_LOSSES[(surrogate, mode)]
    logprobs, old, advantages, mask = _policy_batch(seed)
    knobs = dict(eps_low=eps_low, eps_high=eps_high)
    gradients = []
    for loss in (
        lambda x: agg_loss(POLICY_LOSSES[surrogate](x, old, advantages, mask, **knobs)[0], mask, mode, max_length=12),
        lambda x: old_loss(x, old, advantages, mask, **knobs, max_length=12),
    ):
        x = logprobs.clone().requires_grad_()
        value = loss(x)
        value.backward()
        gradients.append((value.detach(), x.grad))
    (new, new_gradient), (reference, reference_gradient) = gradients
    if bitwise:
        assert torch.equal(new, reference) and torch.equal(new_gradient, reference_gradient)
    else:
        assert torch.allclose(new, reference, rtol=1e-5, atol=1e-7)
        assert torch.allclose(new_gradient, reference_gradient, rtol=1e-5, atol=1e-7)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), max_length=st.integers(9, 40))
def test_aggregation_modes_equal_their_closed_forms_and_ignore_padding(seed, max_length):
    generator = torch.Generator().manual_seed(seed)
    _, _, _, mask = _policy_batch(seed, F64)
    losses = torch.randn(mask.shape, generator=generator, dtype=F64)
    garbage = torch.where(mask.bool(), losses, torch.full_like(losses, float("inf")))  # padding selected away
    rows = [
        [value for value, real in zip(row, keep, strict=True) if real]
        for row, keep in zip(losses.tolist(), mask.bool().tolist(), strict=True)
    ]
    expected = {
        "token_mean": sum(map(sum, rows)) / sum(map(len, rows)),
        "seq_mean_token_mean": sum(sum(row) / len(row) for row in rows) / len(rows),
        "seq_mean_token_sum_norm": sum(map(sum, rows)) / (len(rows) * max_length),
    }
    assert set(expected) == set(LOSS_AGG_MODES)
    for mode, value in expected.items():
        assert agg_loss(garbage, mask, mode, max_length).item() == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("mode", sorted(LOSS_AGG_MODES))
def test_a_modes_normaliser_weights_data_parallel_shares_into_the_whole_minibatchs_loss(mode):
    """What ``per`` says a mode averages over is the weight that makes each rank's loss on its rows, averaged over
    the ranks, the whole minibatch's (``tasks/rl/workers.py:shares``)."""
    _, _, _, mask = _policy_batch(3, F64, rows=7)
    losses = torch.randn(mask.shape, generator=torch.Generator().manual_seed(4), dtype=F64)
    whole = agg_loss(losses, mask, mode, max_length=12)
    parts = torch.arange(len(mask)).tensor_split(3)
    normaliser = mask.sum() if LOSS_AGG_MODES[mode].per == "tokens" else torch.tensor(len(mask), dtype=F64)
    weighted = [
        agg_loss(losses[rows], mask[rows], mode, max_length=12)
        * len(parts)
        * (mask[rows].sum() if LOSS_AGG_MODES[mode].per == "tokens" else len(rows))
        / normaliser
        for rows in parts
    ]
    assert torch.stack(weighted).mean().item() == pytest.approx(whole.item(), rel=1e-12)


def test_overlong_penalty_is_zero_then_linear_then_minus_one():
    lengths = torch.tensor([10, 48, 56, 64, 64])
    truncated = torch.tensor([False, False, False, False, True])
    penalty = overlong_penalty(lengths, truncated, max_length=64, buffer=16)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
