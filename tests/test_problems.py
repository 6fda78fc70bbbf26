"""Problem generators, verifiers and the response format."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.common.config import ArithmeticConfig, CountdownConfig, TaskConfig
from tasks.data.datasets import DatasetError, generate_splits
from tasks.data.problems import Example, arithmetic, countdown, parse_response, score_response


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), digits=st.integers(1, 8), ops=st.sampled_from(["+", "-", "*", "+-*"]))
def test_arithmetic_answer_and_worked_solution_are_right(seed, digits, ops):
    example = arithmetic.generate(random.Random(seed), ArithmeticConfig(digits=digits, ops=ops))
    a, op, b = _split_arithmetic_prompt(example.prompt)
    assert int(example.answer) == {"+": a + b, "-": a - b, "*": a * b}[op]
    assert score_response(example, example.solution) == (True, True)
    # Every column step is itself true arithmetic.
    for step in parse_response(example.solution).think.split(","):
        left, right = step.split("=")
        x, rest = left[0 : left.index(op, 1)], left[left.index(op, 1) + 1 :]
        y, carry = rest.split("+") if op != "-" else rest.split("-")
        value = {
            "+": int(x) + int(y) + int(carry),
            "-": int(x) - int(y) - int(carry),
            "*": int(x) * int(y) + int(carry),
        }
        assert value[op] == int(right)


def _split_arithmetic_prompt(prompt: str) -> tuple[int, str, int]:
    body = prompt.rstrip("=")
    for op in "+-*":
        if op in body:
            a, b = body.split(op)
            return int(a), op, int(b)
    raise AssertionError(prompt)


def test_arithmetic_verifier_rejects_wrong_or_malformed_answers():
    example = Example("arithmetic", "12+30=", "42", "<think></think><answer>42</answer>")
    assert arithmetic.is_correct(example, "42")
    for wrong in ["41", "42.0", "4 2", "", "forty-two", "0x2a"]:
        assert not arithmetic.is_correct(example, wrong)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), count=st.integers(2, 6), ops=st.sampled_from(["+", "+-", "+*", "+-*/"]))
def test_countdown_reference_solution_reaches_target_with_every_number_once(seed, count, ops):
    example = countdown.generate(random.Random(seed), CountdownConfig(count=count, ops=ops))
    value, used = countdown.evaluate(example.answer)
    assert value == example.meta["target"] > 0
    assert sorted(used) == sorted(example.meta["numbers"])
    assert set(example.answer) - set("0123456789()") <= set(ops)
    assert score_response(example, example.solution) == (True, True)


def test_countdown_verifier_accepts_any_correct_expression_and_rejects_the_rest():
    example = Example("countdown", "24 from 2,3,4:", "2*3*4", "", {"numbers": [2, 3, 4], "target": 24})
    assert countdown.is_correct(example, "4*3*2")
    assert countdown.is_correct(example, "(4 * (3 * 2))")
    assert countdown.is_correct(example, "4/(2/3)*3") is False  # uses 3 twice, 2 once: numbers must match exactly
    for wrong in [
        "2*3*4*1",  # a number not given
        "2*3",  # a number unused
        "2+3+4",  # wrong value
        "2*3*4)",  # unbalanced
        "2**3*4",  # not in the grammar
        "__import__('os')",  # text is parsed, never evaluated
        "4/(3-3)*2",  # division by zero
        "",
    ]:
        assert not countdown.is_correct(example, wrong), wrong


def test_countdown_verifier_uses_exact_fractions():
    example = Example("countdown", "", "", "", {"numbers": [1, 3, 3, 8], "target": 24})
    assert countdown.is_correct(example, "8/(3-8/3)") is False  # 8 used twice
    example = Example("countdown", "", "", "", {"numbers": [3, 3, 8, 8], "target": 24})
    assert countdown.is_correct(example, "8/(3-8/3)")


def test_response_format_parsing():
    assert parse_response("<think>a</think><answer>7</answer>") == ("a", "7")
    assert parse_response("<think>a</think><answer>7</answer> trailing") is None
    assert parse_response("<answer>7</answer>") is None
    assert parse_response("<think>a</think>7") is None


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_splits_are_disjoint_seeded_and_sized(name):
    cfg = TaskConfig(name=name)
    train, test = generate_splits(cfg, 2000, 300, seed=3)
    assert (len(train), len(test)) == (2000, 300)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert len({e.prompt for e in train}) == len(train)
    again_train, again_test = generate_splits(cfg, 2000, 300, seed=3)
    assert (again_train, again_test) == (train, test)
    other_train, _ = generate_splits(cfg, 2000, 300, seed=4)
    assert other_train != train


def test_too_small_a_problem_space_is_an_error_naming_the_task_and_the_sizes_of_the_section_that_asked():
    small = TaskConfig(name="arithmetic", arithmetic=ArithmeticConfig(digits=1, ops="+"))
    with pytest.raises(DatasetError, match=r"task.arithmetic: .* data.num_train \+ data.num_test = 550"):
        generate_splits(small, 500, 50, seed=0)
    with pytest.raises(DatasetError, match=r"agent_data.num_train \+ agent_data.num_test = 550"):
        generate_splits(small, 500, 50, seed=0, section="agent_data")
