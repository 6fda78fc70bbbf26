"""Which logged pairs offline DPO learns from (``dpo.pairs``): the verifier's choice, row by row."""

import pytest

from tasks.data.datasets import DatasetError, PreferencePair
from tasks.data.problems import Example
from tasks.stages.dpo import verifier_separated

EXAMPLES = [
    Example("arithmetic", "12+30=", "42", "<think>2+0=2,1+3=4</think><answer>42</answer>"),
    Example("arithmetic", "25+25=", "50", "<think>5+5=10,2+2+1=5</think><answer>50</answer>"),
]


def _pair(prompt: str, chosen: str, rejected: str) -> PreferencePair:
    return PreferencePair(prompt, *(f"<think>...</think><answer>{answer}</answer>" for answer in (chosen, rejected)))


def test_a_pair_is_kept_when_one_response_is_right_and_the_other_wrong_whichever_the_label_prefers():
    pairs = [
        _pair("12+30=", "42", "41"),  # the label prefers the right answer
        _pair("12+30=", "43", "41"),  # both wrong: the judge may still rank them, the verifier cannot
        _pair("25+25=", "40", "50"),  # the label prefers the wrong answer: kept, its side unchanged
        _pair("25+25=", "50", "50"),  # both right
    ]
    assert verifier_separated(pairs, EXAMPLES, "train.jsonl") == [0, 2]


def test_a_pair_whose_prompt_is_no_training_problem_is_an_error_naming_its_line():
    pairs = [_pair("12+30=", "42", "41"), _pair("7+7=", "14", "13")]
    with pytest.raises(DatasetError, match=r"^train.jsonl:2: the prompt '7\+7=' is none of the training problems'"):
        verifier_separated(pairs, EXAMPLES, "train.jsonl")
