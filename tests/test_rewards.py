"""Reward functions: the built-in verifiers, and functions of your own that raise, hang or misbehave."""

import multiprocessing
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.data.problems import Example
from tasks.rl.rewards import RewardInputs, RewardScorer, digit_credit, resolve

EXAMPLE = Example("arithmetic", "12+30=", "42", "<think>2+0+0=2,1+3+0=4</think><answer>42</answer>")
RESPONSES = [EXAMPLE.solution, "<think>2+0+0=2,1+3+0=5</think><answer>52</answer>", "42", "<think>"]

USER_MODULE = """
import os
import time

def first_char_is_digit(batch):
    return [float(r[:1].isdigit()) for r in batch.responses]

def raises_on_digits(batch):
    if any(r[:1].isdigit() for r in batch.responses):
        raise RuntimeError("no digits please")
    return [1.0] * len(batch.responses)

def always_raises(batch):
    raise ValueError("broken")

def hangs(batch):
    time.sleep(60)

def wrong_length(batch):
    return []

def not_a_number(batch):
    return [float("nan")] * len(batch.responses)

def numeric_strings(batch):
    return ["1.0"] * len(batch.responses)

def dies(batch):
    os._exit(3)
"""


def _batch(num_tokens=(30, 35, 2, 40), truncated=(False, False, False, True)) -> RewardInputs:
    return RewardInputs(
        [EXAMPLE] * len(RESPONSES), RESPONSES, list(num_tokens), list(truncated), max_new_tokens=40, overlong_buffer=10
    )


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    """A module of reward functions in the project directory, as a user would write it."""
    (tmp_path / "my_rewards.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    return "my_rewards"


def test_built_in_rewards_score_correctness_format_length_and_overlong():
    batch = _batch()
    with RewardScorer({"accuracy": 1.0, "format": 1.0, "length": 1.0, "overlong": 1.0}, timeout_seconds=60) as scorer:
        total, parts, failures = scorer.score(batch)
    assert parts["accuracy"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert parts["format"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert parts["length"].tolist() == pytest.approx([0.25, 0.125, 0.95, 0.0])
    assert parts["overlong"].tolist() == pytest.approx([0.0, -0.5, 0.0, -1.0])
    assert total.tolist() == pytest.approx([sum(p[i].item() for p in parts.values()) for i in range(4)])
    assert set(failures.values()) == {0}


def test_the_tags_reward_pays_a_quarter_for_each_of_the_formats_tags_written_exactly_once():
    responses = [
        "<think>1+1=2</think><answer>2</answer>",
        "<think>1+1=2</think> so 2",
        "<answer>2</answer><answer>3</answer>",
        "<think> 2 <answer>2",
        "2",
    ]
    batch = RewardInputs([EXAMPLE] * len(responses), responses, [5] * len(responses), [False] * len(responses), 40)
    with RewardScorer({"tags": 1.0}, timeout_seconds=60) as scorer:
        total, parts, _ = scorer.score(batch)
    assert parts["tags"].tolist() == [1.0, 0.5, 0.0, 0.5, 0.0]
    assert total.tolist() == parts["tags"].tolist()


def _answer(text: str) -> str:
    return f"<think>columns</think><answer>{text}</answer>"


def test_the_digits_reward_credits_each_place_of_an_integer_answer_from_the_units():
    example = Example("arithmetic", "61+68=", "129", "<think>1+8+0=9,6+6+0=12</think><answer>129</answer>")
    responses = [_answer("129"), _answer("139"), _answer("43"), _answer("1290"), _answer("-129"), _answer(" 29 ")]
    responses += ["<think>61+68=129</think> 129", _answer("12a")]
    countdown = Example("countdown", "Use 3 5 to make 8", "3+5", "<think>3+5=8</think><answer>3+5</answer>")
    examples = [example] * len(responses) + [countdown]
    batch = RewardInputs(examples, [*responses, _answer("3+5")], [9] * len(examples), [False] * len(examples), 40)
    with RewardScorer({"digits": 1.0}, timeout_seconds=60) as scorer:
        _, parts, failures = scorer.score(batch)
    assert parts["digits"].tolist() == pytest.approx([1.0, 2 / 3, 0.0, 0.0, 0.75, 2 / 3, 0.0, 0.0, 0.0])
    # a task whose answers are not integers is not one the reward applies to: an error, counted, never a silent 0
    assert failures["errors/digits"] == 1


@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6))
def test_the_digits_reward_is_a_share_and_1_only_for_the_right_answer(reference, answer):
    credit = digit_credit(str(reference), _answer(str(answer)))
    assert 0.0 <= credit <= 1.0
    assert (credit == 1.0) == (reference == answer)
    # each place counts the same: the units digit alone right is one place of the wider number's
    width = max(len(str(reference)), len(str(answer)))
    assert credit * width == pytest.approx(round(credit * width))


def test_the_arithmetic_rewards_run_in_the_stages_process_and_the_environments_reward_is_passed_on_as_it_is():
    batch = replace(_batch(), env_rewards=[0.5, -1.0, 0.0, 2.0])
    children = set(multiprocessing.active_children())
    with RewardScorer({"environment": 2.0, "length": 1.0, "overlong": 1.0}, timeout_seconds=60) as scorer:
        total, parts, failures = scorer.score(batch)
        # no reward process: nothing of a task's or a user's code to guard against
        assert set(multiprocessing.active_children()) == children
    assert parts["environment"].tolist() == [0.5, -1.0, 0.0, 2.0] and failures == {}
    assert total.tolist() == pytest.approx([1.0 + 0.25, -2.0 + 0.125 - 0.5, 0.95, 4.0 - 1.0])


def test_weights_combine_the_rewards():
    with RewardScorer({"accuracy": 2.0, "format": -0.5}, timeout_seconds=60) as scorer:
        total, _, _ = scorer.score(_batch())
    assert total.tolist() == pytest.approx([1.5, -0.5, 0.0, 0.0])


def test_a_function_of_your_own_is_named_by_its_import_path(user_rewards):
    with RewardScorer({f"{user_rewards}:first_char_is_digit": 1.0}, timeout_seconds=60) as scorer:
        total, _, _ = scorer.score(_batch())
    assert total.tolist() == [0.0, 0.0, 1.0, 0.0]


def test_a_reward_that_raises_on_some_responses_scores_them_zero_and_counts_them(user_rewards):
    name = f"{user_rewards}:raises_on_digits"
    with RewardScorer({name: 1.0, "format": 1.0}, timeout_seconds=60) as scorer:
        total, parts, failures = scorer.score(_batch())
    assert parts[name].tolist() == [1.0, 1.0, 0.0, 1.0]  # only the response starting with a digit failed
    assert failures[f"errors/{name}"] == 1
    assert parts["format"].tolist() == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("function", ["always_raises", "wrong_length", "not_a_number", "numeric_strings"])
def test_a_broken_reward_is_counted_not_fatal(user_rewards, function):
    name = f"{user_rewards}:{function}"
    with RewardScorer({name: 1.0, "accuracy": 1.0}, timeout_seconds=60) as scorer:
        total, _, failures = scorer.score(_batch())
    assert failures[f"errors/{name}"] == len(RESPONSES)
    assert total.tolist() == [1.0, 0.0, 0.0, 0.0]  # accuracy alone


@pytest.mark.slow
def test_a_reward_over_its_time_budget_scores_zero_and_the_next_batch_is_scored_afresh(user_rewards):
    name = f"{user_rewards}:hangs"
    with RewardScorer({name: 1.0, "accuracy": 1.0}, timeout_seconds=1.0) as scorer:
        total, _, failures = scorer.score(_batch())
        assert failures[f"timeouts/{name}"] == len(RESPONSES)
        assert total.tolist() == [1.0, 0.0, 0.0, 0.0]
        total, _, failures = scorer.score(_batch())  # a fresh process, the same verdict
        assert failures[f"timeouts/{name}"] == len(RESPONSES) and total.tolist() == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("name", "message"),
    [("bogus", "neither a built-in"), ("no_such_module:f", "cannot be imported"), ("my_rewards:missing", "cannot")],
)
def test_a_reward_that_cannot_be_found_is_named_before_anything_runs(user_rewards, name, message):
    with pytest.raises(ValueError, match=message) as error:
        resolve(name)
    assert name in str(error.value)


def test_a_reward_process_that_dies_is_counted_as_a_crash_not_a_timeout(user_rewards):
    name = f"{user_rewards}:dies"
    with RewardScorer({name: 1.0, "accuracy": 1.0}, timeout_seconds=60) as scorer:
        total, _, failures = scorer.score(_batch())
        assert _nonzero(failures) == {f"crashes/{name}": len(RESPONSES)} and total.tolist() == [1.0, 0.0, 0.0, 0.0]
        _, _, failures = scorer.score(_batch())  # a fresh process, the same verdict
        assert _nonzero(failures) == {f"crashes/{name}": len(RESPONSES)}


def _nonzero(failures: dict[str, int]) -> dict[str, int]:
    return {metric: count for metric, count in failures.items() if count}


@pytest.mark.parametrize(
    ("function", "warn_fraction", "warned"),
    [("always_raises", 0.5, True), ("raises_on_digits", 0.5, False), ("raises_on_digits", 0.2, True)],
)
def test_a_reward_failing_on_more_than_the_set_fraction_warns_in_the_log(
    user_rewards, capsys, function, warn_fraction, warned
):
    name = f"{user_rewards}:{function}"
    with RewardScorer({name: 1.0}, timeout_seconds=60, warn_fraction=warn_fraction) as scorer:
        _, _, failures = scorer.score(_batch())
    failed = failures[f"errors/{name}"]
    warning = f"WARNING reward {name!r} failed on {failed} of {len(RESPONSES)} responses"
    assert (warning in capsys.readouterr().out) == warned
