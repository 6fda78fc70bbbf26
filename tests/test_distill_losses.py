"""Distillation losses against closed forms computed independently (torch.distributions, enumeration)."""

import itertools

import pytest
import torch
from torch.distributions import Categorical, kl_divergence

from tasks.rl.distill_losses import DISTILL_LOSSES

gkd, reverse_kl = DISTILL_LOSSES["gkd"], DISTILL_LOSSES["reverse_kl"]
BETAS = (0.0, 1e-6, 1e-3, 0.1, 0.5, 0.9, 1 - 1e-3, 1 - 1e-6, 1.0)


def _logits(seed: int, shape=(3, 5, 11), scale: float = 3.0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    return kl_divergence(Categorical(logits=p_logits), Categorical(logits=q_logits))


def _full(shape) -> torch.Tensor:
    return torch.ones(shape[:-1], dtype=torch.float64)


@pytest.mark.parametrize("seed", range(5))
def test_gkd_ends_are_forward_and_reverse_kl(seed):
    student, teacher = _logits(seed), _logits(seed + 100)
    mask = _full(student.shape)
    torch.testing.assert_close(gkd(student, teacher, mask, beta=0.0), _kl(teacher, student), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gkd(student, teacher, mask, beta=1.0), _kl(student, teacher), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("beta", (0.05, 0.3, 0.5, 0.77))
def test_gkd_between_the_ends_is_the_scaled_jensen_shannon_divergence(beta):
    student, teacher = _logits(1), _logits(2)
    p_teacher, p_student = teacher.softmax(-1), student.softmax(-1)
    mixture = (beta * p_teacher + (1 - beta) * p_student).log()
    jsd = beta * _kl(teacher, mixture) + (1 - beta) * _kl(student, mixture)
    expected = jsd / (beta * (1 - beta))
    torch.testing.assert_close(gkd(student, teacher, _full(student.shape), beta=beta), expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_gkd_is_continuous_into_both_ends(dtype):
    """Near an end the gap to it shrinks in proportion to the distance (tenfold per decade of beta), down to a
    millionth of the divergence: no jump and no collapse to zero."""
    student, teacher = _logits(3, dtype=dtype, scale=1.0), _logits(4, dtype=dtype, scale=1.0)
    mask = torch.ones(student.shape[:-1], dtype=dtype)
    distances = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
    for end, towards in ((0.0, lambda d: d), (1.0, lambda d: 1 - d)):
        at_end = gkd(student, teacher, mask, beta=end)
        gaps = [(gkd(student, teacher, mask, beta=towards(d)) - at_end).abs().max().item() for d in distances]
        assert all(8 < before / after < 12 for before, after in zip(gaps, gaps[1:], strict=False)), gaps
        assert gaps[-1] < 1e-5 * at_end.max().item()


@pytest.mark.parametrize("beta", BETAS)
def test_gkd_is_zero_when_the_student_is_the_teacher_and_never_negative(beta):
    same = _logits(5, dtype=torch.float32)
    mask = torch.ones(same.shape[:-1])
    assert (gkd(same, same.clone(), mask, beta=beta) == 0).all()
    for seed in range(20):
        student, teacher = _logits(seed, dtype=torch.float32, scale=10.0), _logits(seed + 50, dtype=torch.float32)
        near = teacher + 1e-4 * _logits(seed + 99, dtype=torch.float32)  # where round-off could go below zero
        for other in (student, near):
            assert (gkd(other, teacher, mask, beta=beta) >= 0).all()


def test_gkd_stays_finite_for_distributions_far_apart():
    student = torch.zeros(1, 1, 6, dtype=torch.float32)
    teacher = student.clone()
    student[..., 0], teacher[..., 1] = 90.0, 90.0  # log-ratios of +-90 overflow a naive exp in float32
    student.requires_grad_(True)
    for beta in BETAS:
        value = gkd(student, teacher, torch.ones(1, 1), beta=beta)
        (gradient,) = torch.autograd.grad(value.sum(), student)
        assert torch.isfinite(value).all() and torch.isfinite(gradient).all() and value.item() > 0


def test_padding_contributes_nothing():
    student, teacher = _logits(6), _logits(7)
    mask = _full(student.shape)
    mask[0, 3:], mask[2, 1:] = 0, 0
    garbage_student, garbage_teacher = student.clone(), teacher.clone()
    garbage_student[~mask.bool()] = 1e4
    garbage_teacher[~mask.bool()] = -1e4
    for beta in (0.0, 0.5, 1.0):
        clean = gkd(student, teacher, mask, beta=beta)
        torch.testing.assert_close(gkd(garbage_student, garbage_teacher, mask, beta=beta), clean)
        assert (clean[~mask.bool()] == 0).all()
    sampled = torch.randn(3, 5, dtype=torch.float64)
    dirty = sampled.clone()
    dirty[~mask.bool()] = float("nan")
    estimate = reverse_kl(dirty, torch.zeros_like(dirty), mask)
    assert torch.equal(estimate, reverse_kl(sampled, torch.zeros_like(sampled), mask))
    assert (estimate[~mask.bool()] == 0).all()


@pytest.mark.parametrize("seed", range(3))
def test_the_sampled_token_estimate_averages_to_the_exact_reverse_kl(seed):
    """Enumerate every token of a 7-token vocabulary: E_{y ~ π_s}[log π_s(y) − log π_t(y)] = KL(π_s ‖ π_t)."""
    student, teacher = _logits(seed, shape=(4, 7)), _logits(seed + 10, shape=(4, 7))
    log_student, log_teacher = student.log_softmax(-1), teacher.log_softmax(-1)
    tokens = torch.arange(7).expand(4, 7)
    estimates = reverse_kl(log_student.gather(-1, tokens), log_teacher.gather(-1, tokens), torch.ones(4, 7))
    expectation = (log_student.exp() * estimates).sum(-1)
    torch.testing.assert_close(expectation, _kl(student, teacher), rtol=1e-10, atol=1e-12)


def test_summed_over_a_response_it_averages_to_the_sequence_level_reverse_kl():
    """Two tokens from a 3-token vocabulary, the second conditioned on the first: enumerating all 9 responses,
    the per-token estimates summed over a response average to KL(π_s ‖ π_t) between the response distributions."""
    vocabulary = 3
    first_student, first_teacher = _logits(20, shape=(vocabulary,)), _logits(21, shape=(vocabulary,))
    second_student, second_teacher = _logits(22, shape=(vocabulary, vocabulary)), _logits(23, (vocabulary, vocabulary))
    responses = list(itertools.product(range(vocabulary), repeat=2))
    log_student = torch.stack(
        [torch.stack([first_student.log_softmax(-1)[a], second_student[a].log_softmax(-1)[b]]) for a, b in responses]
    )
    log_teacher = torch.stack(
        [torch.stack([first_teacher.log_softmax(-1)[a], second_teacher[a].log_softmax(-1)[b]]) for a, b in responses]
    )
    estimates = reverse_kl(log_student, log_teacher, torch.ones(len(responses), 2)).sum(-1)
    probability_student, probability_teacher = log_student.sum(-1).exp(), log_teacher.sum(-1).exp()
    exact = (probability_student * (probability_student.log() - probability_teacher.log())).sum()
    torch.testing.assert_close((probability_student * estimates).sum(), exact, rtol=1e-10, atol=1e-12)


def test_as_a_dense_advantage_its_expected_gradient_is_the_reverse_kl_gradient():
    """The policy-gradient surrogate −A·log π_s with A = −(log π_s − log π_t) (detached), averaged over the tokens
    the student samples, has the gradient of KL(π_s ‖ π_t) (the score function's mean is zero)."""
    student = _logits(30, shape=(2, 9)).requires_grad_(True)
    teacher = _logits(31, shape=(2, 9))
    log_student = student.log_softmax(-1)
    advantage = -reverse_kl(log_student.detach(), teacher.log_softmax(-1), torch.ones(2, 9))
    surrogate = (log_student.exp().detach() * -advantage * log_student).sum()
    (from_surrogate,) = torch.autograd.grad(surrogate, student)
    (exact,) = torch.autograd.grad(_kl(student, teacher).sum(), student)
    torch.testing.assert_close(from_surrogate, exact, rtol=1e-10, atol=1e-12)


def test_the_registry_says_which_loss_needs_the_full_vocabulary():
    assert DISTILL_LOSSES["gkd"].full_vocabulary and not DISTILL_LOSSES["reverse_kl"].full_vocabulary
