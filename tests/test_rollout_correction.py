"""The engine-trainer mismatch correction (tasks/rl/rollout_correction.py) against its closed forms, the definitions
verl's rollout correction (``compute_rollout_correction_weights`` and its rejection mask) uses on the same inputs,
and in the policy-gradient loss."""

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.common.config import RLConfig
from tasks.rl.core_algos import agg_loss, ppo_surrogate
from tasks.rl.policy_gradient import policy_gradient_loss
from tasks.rl.rollout_correction import (
    IS_WEIGHTS,
    REJECTIONS,
    correction,
    importance_weights,
    mismatch_metrics,
    off_policy,
)
from tasks.rl.workers import Minibatch

F64 = torch.float64


def _logprobs(seed: int, rows: int = 6, width: int = 7, spread: float = 1.0):
    """π_old's and μ's log-probs of right-padded responses, and their mask; padding holds garbage in both."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    mask = (torch.arange(width) < lengths[:, None]).to(F64)
    engine = -torch.rand(rows, width, generator=generator, dtype=F64) * 3
    old = engine + spread * torch.randn(rows, width, generator=generator, dtype=F64)
    garbage = torch.full_like(old, 1e4)
    return torch.where(mask.bool(), old, garbage), torch.where(mask.bool(), engine, -garbage), mask


def _corrected(weights: str = "none", rejection: str = "none", cap: float = 2.0, bound: float = 2.0) -> RLConfig:
    cfg = RLConfig()
    settings_ = replace(cfg.rollout_correction, weights=weights, weight_cap=cap, rejection=rejection)
    return replace(cfg, rollout_correction=replace(settings_, rejection_bound=bound))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), cap=st.floats(1.0, 5.0), spread=st.floats(0.01, 3.0))
def test_token_weights_are_the_ratio_truncated_at_the_cap(seed, cap, spread):
    old, engine, mask = _logprobs(seed, spread=spread)
    weights = IS_WEIGHTS["token"](old - engine, mask, cap)
    for row, column in mask.nonzero().tolist():
        ratio = math.exp(old[row, column].item() - engine[row, column].item())
        assert weights[row, column].item() == pytest.approx(min(ratio, cap), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), cap=st.floats(1.0, 5.0), spread=st.floats(0.01, 3.0))
def test_sequence_weights_are_the_responses_ratio_product_truncated_on_each_of_its_tokens(seed, cap, spread):
    old, engine, mask = _logprobs(seed, spread=spread)
    weights = IS_WEIGHTS["sequence"](old - engine, mask, cap)
    for row in range(len(mask)):
        tokens = mask[row].bool()
        product = math.prod(math.exp(o - e) for o, e in zip(old[row, tokens], engine[row, tokens], strict=True))
        assert torch.allclose(weights[row, tokens], torch.tensor(min(product, cap), dtype=F64), rtol=1e-10)


def test_a_long_responses_sequence_weight_stays_finite_where_the_product_overflows():
    log_ratio = torch.full((2, 4000), 0.5, dtype=F64)  # exp(2000) overflows float64
    log_ratio[1] = -0.5
    mask = torch.ones_like(log_ratio)
    weights = IS_WEIGHTS["sequence"](log_ratio, mask, 2.0)
    assert torch.equal(weights[0], torch.full((4000,), 2.0, dtype=F64))
    assert torch.isfinite(weights).all() and (weights[1] == 0).all()  # exp(-2000) underflows to 0, as it is


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), bound=st.floats(1.0, 4.0), spread=st.floats(0.01, 2.0))
def test_each_rejection_keeps_exactly_the_ratios_within_its_bound(seed, bound, spread):
    old, engine, mask = _logprobs(seed, spread=spread)
    log_ratio = old - engine
    tokens = mask.bool()
    within = lambda value: 1 / bound <= math.exp(value) <= bound  # noqa: E731

    kept = REJECTIONS["token"](log_ratio, mask, bound)
    for row, column in tokens.nonzero().tolist():
        assert kept[row, column].item() == within(log_ratio[row, column].item())
    for name, statistic in (("sequence", torch.sum), ("geometric", torch.mean)):
        kept = REJECTIONS[name](log_ratio, mask, bound)
        for row in range(len(mask)):
            expected = within(statistic(log_ratio[row, tokens[row]]).item())
            assert kept[row, tokens[row]].tolist() == [expected] * int(tokens[row].sum())


@pytest.mark.parametrize("weights", ["none", *IS_WEIGHTS])
@pytest.mark.parametrize("rejection", ["none", *REJECTIONS])
def test_an_engine_that_agrees_with_the_trainer_changes_nothing(weights, rejection):
    old, _, mask = _logprobs(0)
    settings = off_policy(_corrected(weights, rejection, cap=1.0, bound=1.0), len(mask))
    factor = correction(old, old.clone(), mask, settings)
    assert torch.equal(factor[mask.bool()], torch.ones(int(mask.sum()), dtype=F64))


def test_auto_weighs_tokens_only_where_the_engine_can_differ_from_the_trainer():
    fp32_hf = RLConfig()
    assert importance_weights(fp32_hf) == "none"  # the tiny default: same weights, same kernels
    assert importance_weights(replace(fp32_hf, precision="bf16-mixed")) == "token"  # a bfloat16 engine
    assert importance_weights(replace(fp32_hf, rollout_backend="vllm")) == "token"
    assert importance_weights(_corrected("sequence")) == "sequence"
    assert importance_weights(replace(_corrected("none"), rollout_backend="vllm")) == "none"


def _minibatch(old, engine, mask, advantages, logprobs):
    return Minibatch(
        part=SimpleNamespace(response_mask=mask),
        logprobs=logprobs,
        logits=torch.zeros(*mask.shape, 3, dtype=F64),
        old_logprobs=old,
        inputs={"advantages": advantages, "engine_logprobs": engine},
        per_item=1.0,
        per_token=1.0,
    )


@pytest.mark.parametrize(("weights", "rejection"), [("token", "none"), ("sequence", "geometric"), ("none", "token")])
def test_the_policy_loss_is_the_surrogate_times_the_correction_and_the_weights_carry_no_gradient(weights, rejection):
    old, engine, mask = _logprobs(3, spread=0.8)
    advantages = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1), dtype=F64) * mask
    logprobs = (old + 0.1).detach().requires_grad_()
    cfg = replace(_corrected(weights, rejection, cap=1.5, bound=1.5), kl_loss="none", entropy_coef=0.0)
    loss, _ = policy_gradient_loss(_minibatch(old, engine, mask, advantages, logprobs), cfg, kl_coef=0.0)
    loss.backward()

    expected_logprobs = (old + 0.1).detach().requires_grad_()
    surrogate, _ = ppo_surrogate(expected_logprobs, old, advantages, mask, cfg.clip_low, cfg.clip_high)
    factor = torch.ones_like(mask)
    log_ratio = torch.where(mask.bool(), old - engine, 0)
    if weights == "token":
        factor = log_ratio.exp().clamp(max=1.5)
    if weights == "sequence":
        factor = log_ratio.sum(-1, keepdim=True).exp().clamp(max=1.5).expand_as(mask)
    if rejection == "token":
        factor = factor * (log_ratio.abs() <= math.log(1.5))
    if rejection == "geometric":
        mean = log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
        factor = factor * (mean.abs() <= math.log(1.5))
    expected = agg_loss(surrogate * factor, mask, cfg.loss_agg_mode, cfg.max_new_tokens)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert torch.allclose(logprobs.grad, expected_logprobs.grad, rtol=1e-10, atol=1e-14)
    assert not torch.equal(factor, torch.ones_like(factor))  # the inputs do disagree: the case is not trivial


def test_the_logged_metrics_say_how_far_the_engine_was_and_what_the_correction_did():
    old, engine, mask = _logprobs(5, spread=1.0)
    metrics = mismatch_metrics(old, engine, mask, off_policy(_corrected("token", "token", cap=2.0, bound=3.0), 4))
    tokens = mask.bool()
    log_ratio = (old - engine)[tokens]
    assert metrics["mismatch_kl"] == pytest.approx((log_ratio.exp() - 1 - log_ratio).mean().item())
    assert metrics["is_weight"] == pytest.approx(log_ratio.exp().clamp(max=2.0).mean().item())
    assert metrics["is_truncated_fraction"] == pytest.approx((log_ratio > math.log(2.0)).double().mean().item())
    assert metrics["rejected_fraction"] == pytest.approx((log_ratio.abs() > math.log(3.0)).double().mean().item())
    assert 0 < metrics["rejected_fraction"] < 1 and 0 < metrics["is_truncated_fraction"] < 1  # neither case trivial
    nothing = off_policy(RLConfig(), 4)
    assert set(mismatch_metrics(old, engine, mask, nothing)) == {"mismatch_kl"}  # nothing corrected, nothing to say


def test_responses_no_engine_sampled_are_not_corrected():
    """A distillation iteration on the teacher's responses has no engine log-probs: its surrogate stands as it is."""
    old, engine, mask = _logprobs(4, spread=0.8)
    advantages = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2), dtype=F64) * mask
    cfg = replace(_corrected("token", "token", cap=1.2, bound=1.2), kl_loss="none")
    sampled = _minibatch(old, engine, mask, advantages, old + 0.1)
    teachers = replace(sampled, inputs={"advantages": advantages})
    surrogate, _ = ppo_surrogate(old + 0.1, old, advantages, mask, cfg.clip_low, cfg.clip_high)
    plain = agg_loss(surrogate, mask, cfg.loss_agg_mode, cfg.max_new_tokens)
    assert policy_gradient_loss(teachers, cfg, kl_coef=0.0)[0].item() == plain.item()
    assert policy_gradient_loss(sampled, cfg, kl_coef=0.0)[0].item() != plain.item()


def test_one_function_decides_where_pi_old_comes_from_and_what_corrects_the_gap():
    one_step = replace(RLConfig(), epochs=1, minibatch_size=8, kl_in_reward=False, sync_every=1)
    assert off_policy(one_step, 8).old_logprobs == "update"  # the single step's own forward pass is π_old
    assert off_policy(one_step, 9).old_logprobs == "actor"  # two minibatches: π_old must be fixed before the first
    assert off_policy(replace(one_step, epochs=2), 8).old_logprobs == "actor"
    assert off_policy(replace(one_step, kl_in_reward=True), 8).old_logprobs == "actor"  # the reward reads it first
    semi_online = replace(one_step, sync_every=2)
    assert off_policy(semi_online, 8).old_logprobs == "engine"  # the engine's older weights are π_old
    assert off_policy(semi_online, 8, on_policy=False).old_logprobs == "update"  # a teacher's responses: no engine
    settings = off_policy(_corrected("sequence", "geometric", cap=3.0, bound=4.0), 8)
    assert (settings.weights, settings.weight_cap, settings.rejection, settings.rejection_bound) == (
        "sequence",
        3.0,
        "geometric",
        4.0,
    )
    assert settings.corrected and not off_policy(one_step, 8).corrected
