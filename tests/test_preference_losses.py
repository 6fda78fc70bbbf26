"""Property tests of the preference losses against their closed forms (tasks/rl/preference_losses.py)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.rl.preference_losses import (
    PREFERENCE_LOSSES,
    PairLogprobs,
    best_and_worst,
    log1mexp,
    preference_loss,
    sequence_logprobs,
)

KNOBS = {"beta": 0.1, "label_smoothing": 0.1, "simpo_gamma": 0.5}
WITH_REFERENCE = [name for name, loss in PREFERENCE_LOSSES.items() if loss.needs_reference]
REFERENCE_FREE = [name for name, loss in PREFERENCE_LOSSES.items() if not loss.needs_reference]
seeds = st.integers(0, 10_000)


def _pairs(seed: int, num_pairs: int = 6, reference: bool = True, requires_grad: bool = False) -> PairLogprobs:
    generator = torch.Generator().manual_seed(seed)

    def logprobs() -> torch.Tensor:
        return -torch.rand(num_pairs, generator=generator, dtype=torch.float64) * 20 - 0.1

    chosen, rejected = logprobs().requires_grad_(requires_grad), logprobs().requires_grad_(requires_grad)
    tokens = torch.randint(1, 30, (2, num_pairs), generator=generator).double()
    ref = (logprobs(), logprobs()) if reference else (None, None)
    return PairLogprobs(chosen, rejected, tokens[0], tokens[1], *ref)


def test_the_issue_names_every_loss_and_the_registry_says_which_need_a_reference():
    assert set(PREFERENCE_LOSSES) == {"dpo", "cdpo", "ipo", "hinge", "simpo", "orpo"}
    assert set(REFERENCE_FREE) == {"simpo", "orpo"}


@given(seeds, st.floats(0.01, 5.0))
@settings(max_examples=40, deadline=None)
def test_dpo_loss_is_log_2_when_the_policy_is_the_reference(seed, beta):
    pairs = _pairs(seed)
    at_reference = PairLogprobs(pairs.chosen, pairs.rejected, pairs.chosen_tokens, pairs.rejected_tokens,
                                pairs.chosen, pairs.rejected)  # fmt: skip
    losses, chosen, rejected = PREFERENCE_LOSSES["dpo"](at_reference, beta=beta)
    torch.testing.assert_close(losses, torch.full_like(losses, math.log(2)))
    assert torch.all(chosen == 0) and torch.all(rejected == 0)


def _descent_gap(pairs: PairLogprobs, name: str) -> torch.Tensor:
    """How much more a gradient-descent step raises each pair's chosen log-prob than its rejected one (per token
    for the length-normalised losses)."""
    losses, _, _ = PREFERENCE_LOSSES[name](pairs, **KNOBS)
    losses.sum().backward()
    chosen_step, rejected_step = -pairs.chosen.grad, -pairs.rejected.grad
    if name in REFERENCE_FREE:
        chosen_step, rejected_step = chosen_step / pairs.chosen_tokens, rejected_step / pairs.rejected_tokens
    return chosen_step - rejected_step


@given(seeds, st.sampled_from(WITH_REFERENCE))
@settings(max_examples=40, deadline=None)
def test_from_the_reference_a_gradient_step_raises_the_chosen_log_prob_relative_to_the_rejected(seed, name):
    pairs = _pairs(seed, requires_grad=True)
    at_reference = PairLogprobs(pairs.chosen, pairs.rejected, pairs.chosen_tokens, pairs.rejected_tokens,
                                pairs.chosen.detach(), pairs.rejected.detach())  # fmt: skip
    assert torch.all(_descent_gap(at_reference, name) > 0)


@given(seeds, st.sampled_from(["dpo", *REFERENCE_FREE]))
@settings(max_examples=40, deadline=None)
def test_dpo_simpo_and_orpo_raise_the_chosen_relative_to_the_rejected_from_anywhere(seed, name):
    assert torch.all(_descent_gap(_pairs(seed, requires_grad=True), name) > 0)


@given(seeds, st.floats(0.01, 5.0))
@settings(max_examples=40, deadline=None)
def test_cdpo_without_smoothing_is_dpo(seed, beta):
    pairs = _pairs(seed)
    dpo, _, _ = PREFERENCE_LOSSES["dpo"](pairs, beta=beta)
    cdpo, _, _ = PREFERENCE_LOSSES["cdpo"](pairs, beta=beta, label_smoothing=0.0)
    torch.testing.assert_close(cdpo, dpo)


@given(seeds, st.floats(0.01, 5.0))
@settings(max_examples=40, deadline=None)
def test_cdpo_at_half_smoothing_has_no_gradient_at_the_reference_and_pulls_back_to_it(seed, beta):
    """Labels at chance carry no preference: the reference (margin 0) is the minimum, and any margin is pulled
    back toward 0, from either side."""
    pairs = _pairs(seed, requires_grad=True)
    at_reference = PairLogprobs(pairs.chosen, pairs.rejected, pairs.chosen_tokens, pairs.rejected_tokens,
                                pairs.chosen.detach(), pairs.rejected.detach())  # fmt: skip
    losses, _, _ = PREFERENCE_LOSSES["cdpo"](at_reference, beta=beta, label_smoothing=0.5)
    losses.sum().backward()
    torch.testing.assert_close(pairs.chosen.grad, torch.zeros_like(pairs.chosen))

    moved = _pairs(seed, requires_grad=True)
    losses, _, _ = PREFERENCE_LOSSES["cdpo"](moved, beta=beta, label_smoothing=0.5)
    losses.sum().backward()
    margin = moved.log_ratio_margin().detach()
    assert torch.all(torch.sign(moved.chosen.grad) == torch.sign(margin))  # descent moves the margin toward 0


@given(seeds, st.floats(0.05, 5.0))
@settings(max_examples=40, deadline=None)
def test_ipo_loss_is_minimised_at_a_margin_of_one_over_two_beta(seed, beta):
    pairs = _pairs(seed, num_pairs=1)
    target = 1 / (2 * beta)

    def loss_at(margin: float) -> float:
        shifted = PairLogprobs(pairs.ref_chosen + margin, pairs.ref_rejected, pairs.chosen_tokens,
                               pairs.rejected_tokens, pairs.ref_chosen, pairs.ref_rejected)  # fmt: skip
        return PREFERENCE_LOSSES["ipo"](shifted, beta=beta)[0].item()

    assert loss_at(target) == pytest.approx(0.0, abs=1e-9)
    assert loss_at(target + 0.3) > loss_at(target) and loss_at(target - 0.3) > loss_at(target)


@given(seeds, st.sampled_from(REFERENCE_FREE))
@settings(max_examples=30, deadline=None)
def test_simpo_and_orpo_do_not_depend_on_the_reference(seed, name):
    pairs = _pairs(seed)
    other = _pairs(seed + 1)
    rebased = PairLogprobs(pairs.chosen, pairs.rejected, pairs.chosen_tokens, pairs.rejected_tokens,
                           other.ref_chosen, other.ref_rejected)  # fmt: skip
    without = PairLogprobs(pairs.chosen, pairs.rejected, pairs.chosen_tokens, pairs.rejected_tokens)
    for variant in (rebased, without):
        for left, right in zip(
            PREFERENCE_LOSSES[name](pairs, **KNOBS), PREFERENCE_LOSSES[name](variant, **KNOBS), strict=True
        ):
            torch.testing.assert_close(left, right)


@pytest.mark.parametrize("name", WITH_REFERENCE)
def test_the_losses_that_need_a_reference_say_so_without_one(name):
    with pytest.raises(ValueError, match="reference"):
        PREFERENCE_LOSSES[name](_pairs(0, reference=False), **KNOBS)


@given(seeds, st.sampled_from(WITH_REFERENCE + REFERENCE_FREE))
@settings(max_examples=60, deadline=None)
def test_swapping_chosen_and_rejected_changes_the_sign_of_every_margin(seed, name):
    pairs = _pairs(seed)
    swapped = PairLogprobs(pairs.rejected, pairs.chosen, pairs.rejected_tokens, pairs.chosen_tokens,
                           pairs.ref_rejected, pairs.ref_chosen)  # fmt: skip
    _, chosen, rejected = PREFERENCE_LOSSES[name](pairs, **KNOBS)
    _, swapped_chosen, swapped_rejected = PREFERENCE_LOSSES[name](swapped, **KNOBS)
    torch.testing.assert_close(swapped_chosen - swapped_rejected, -(chosen - rejected))


@given(seeds, st.integers(1, 8))
@settings(max_examples=30, deadline=None)
def test_padding_tokens_contribute_nothing_whatever_they_hold(seed, padding):
    generator = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(4, 10, generator=generator)
    mask = (torch.arange(10) < torch.randint(1, 11, (4, 1), generator=generator)).float()
    padded_logprobs = torch.cat([torch.where(mask.bool(), logprobs, float("nan")), torch.full((4, padding), -1e30)], 1)
    padded_mask = torch.cat([mask, torch.zeros(4, padding)], 1)
    sums, lengths = sequence_logprobs(logprobs * mask, mask)
    padded_sums, padded_lengths = sequence_logprobs(padded_logprobs, padded_mask)
    torch.testing.assert_close(padded_sums, sums)
    torch.testing.assert_close(padded_lengths, lengths)


@given(seeds)
@settings(max_examples=30, deadline=None)
def test_the_sft_term_adds_the_chosen_responses_mean_token_nll(seed):
    pairs = _pairs(seed)
    plain, _, _ = preference_loss("dpo", pairs, beta=0.1)
    with_sft, _, _ = preference_loss("dpo", pairs, beta=0.1, sft_weight=0.5)
    torch.testing.assert_close(with_sft - plain, -0.5 * pairs.chosen / pairs.chosen_tokens)


def test_orpo_includes_the_chosen_nll_and_an_odds_ratio_term_in_closed_form():
    pairs = PairLogprobs(torch.tensor([-2.0]), torch.tensor([-6.0]), torch.tensor([4.0]), torch.tensor([3.0]))
    losses, chosen, rejected = PREFERENCE_LOSSES["orpo"](pairs, beta=0.2)
    p_chosen, p_rejected = math.exp(-0.5), math.exp(-2.0)
    log_odds_chosen = math.log(p_chosen / (1 - p_chosen))
    log_odds_rejected = math.log(p_rejected / (1 - p_rejected))
    expected = 0.5 - 0.2 * math.log(1 / (1 + math.exp(-(log_odds_chosen - log_odds_rejected))))
    assert losses.item() == pytest.approx(expected, rel=1e-5)
    assert (chosen - rejected).item() == pytest.approx(log_odds_chosen - log_odds_rejected, rel=1e-5)


def test_orpo_log_odds_stay_exact_in_float32_as_the_mean_log_prob_nears_zero():
    """log(p / (1 − p)) at log p = −2e-6: 1 − exp(log p) in float32 keeps a few digits (log1p(−exp(x)) was 1.3e-2
    off in the log-odds here), −expm1(log p) keeps them all. Against the same formula in float64."""
    mean_logprob = torch.tensor([-2e-6])
    pairs = PairLogprobs(mean_logprob, torch.tensor([-3.0]), torch.tensor([1.0]), torch.tensor([1.0]))
    _, chosen, _ = PREFERENCE_LOSSES["orpo"](pairs, beta=0.2)
    x = mean_logprob.item()  # the float32 input, exactly, in float64
    assert chosen.dtype == torch.float32
    assert chosen.item() == pytest.approx(x - math.log(-math.expm1(x)), abs=1e-5)


@settings(max_examples=200, deadline=None)
@given(st.floats(-60.0, -1e-7))
def test_log1mexp_is_accurate_in_float32_on_both_sides_of_its_branch(x):
    value = torch.tensor([x], dtype=torch.float32)
    x = value.item()  # in float64, where either form is exact on its own side of the branch
    exact = math.log(-math.expm1(x)) if x > -math.log(2) else math.log1p(-math.exp(x))
    assert log1mexp(value).item() == pytest.approx(exact, rel=1e-6, abs=1e-30)


def test_online_pairs_are_each_groups_best_and_worst_and_a_tied_group_makes_none():
    scores = torch.tensor([0.1, 0.9, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0, 1.0])
    chosen, rejected = best_and_worst(scores, group_size=4)
    assert chosen.tolist() == [1, 8] and rejected.tolist() == [0, 9]  # the middle group is all ties; first of equals
    assert torch.all(scores[chosen] > scores[rejected])
