"""Worked traces are replayed against their task at the data stage (``tasks/data/trace_replay.py``): a call the task
refuses, a reply it would not give, or a trace that goes on past the episode's end is an error naming the row's
``file:line`` (or, for a generated row, its split and number) before anything is written."""

import json
from pathlib import Path

import pytest

from tasks.data.datasets import DatasetError
from tasks.params.load import load_params
from tasks.stages.data import splits

CALL = '<tool_call>{{"name": "calculate", "arguments": {arguments}}}</tool_call>'
SOLUTION = "<think>100*10=1000</think><answer>1000</answer>"  # a prompt the generated held-out split never asks


def calculator_row(call: str, reply: str, *more: dict) -> dict:
    turns = [{"role": "assistant", "content": call}, {"role": "tool", "content": reply}, *more]
    turns.append({"role": "assistant", "content": SOLUTION})
    meta = {"turns": turns}
    return {
        "task": "examples.calculator",
        "prompt": "What is 100*10?",
        "answer": "1000",
        "solution": SOLUTION,
        "meta": meta,
    }


GOOD_CALL = CALL.format(arguments='{"expression": "100*10"}')
BAD_TRACES = [
    (calculator_row(GOOD_CALL, "1001"), "meta 'turns'[1]: the task answers '1000' where the trace says '1001'"),
    (calculator_row('<tool_call>{"name": "calculate", "arguments": {</tool_call>', "1000"), "meta 'turns'[0]:"),
    (calculator_row(GOOD_CALL.replace("calculate", "compute"), "1000"), "meta 'turns'[0]:"),
    (calculator_row(CALL.format(arguments='{"expression": "100*10", "digits": 3}'), "1000"), "meta 'turns'[0]:"),
    (
        calculator_row(GOOD_CALL, "1000", {"role": "assistant", "content": "let me think"}),
        "meta 'turns'[2]: the task ends the episode at this turn, but the trace goes on",
    ),
]


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)  # data of your own lives under the project's data/
    return tmp_path


def _params(*overrides: str):
    return load_params(Path(__file__).parents[1] / "params.yaml", list(overrides))


@pytest.mark.parametrize(("row", "message"), BAD_TRACES, ids=["reply", "json", "unknown-tool", "argument", "goes-on"])
def test_a_trace_the_tools_would_not_play_is_refused_naming_its_file_and_line(project, row, message):
    good = calculator_row(GOOD_CALL, "1000")
    (project / "data/train.jsonl").write_text("\n".join(json.dumps(r) for r in (good, row)) + "\n")
    params = _params("agent_data.train_file=data/train.jsonl", "agent_data.num_test=4")
    with pytest.raises(DatasetError) as error:
        splits(params, "agent_data")
    assert str(error.value).startswith("data/train.jsonl:2: ") and message in str(error.value), str(error.value)


def test_the_same_rows_as_the_tools_answer_them_pass(project):
    (project / "data/train.jsonl").write_text(json.dumps(calculator_row(GOOD_CALL, "1000")) + "\n")
    train, _ = splits(_params("agent_data.train_file=data/train.jsonl", "agent_data.num_test=4"), "agent_data")
    assert len(train) == 1


def test_a_trace_may_show_a_tools_error_answer_and_the_recovery_from_it(project):
    from examples.calculator import calculate

    divide = CALL.format(arguments='{"expression": "100/10"}')
    refused = calculate("100/10")
    assert refused.startswith("error: ")  # the calculator's own answer: it takes + - * only
    row = calculator_row(
        divide, refused, {"role": "assistant", "content": GOOD_CALL}, {"role": "tool", "content": "1000"}
    )
    (project / "data/train.jsonl").write_text(json.dumps(row) + "\n")
    train, _ = splits(_params("agent_data.train_file=data/train.jsonl", "agent_data.num_test=4"), "agent_data")
    assert train[0].meta["turns"] == row["meta"]["turns"]


def test_a_worlds_recorded_reply_must_be_what_the_world_says(project):
    params = _params("agent_data.task=examples.guess_number", "agent_data.num_train=2", "agent_data.num_test=2")
    train, _ = splits(params, "agent_data")  # generated traces replay as the world answers them
    row = train[0].to_row()
    row["meta"]["turns"][1]["content"] = "lower" if row["meta"]["turns"][1]["content"] == "higher" else "higher"
    (project / "data/train.jsonl").write_text(json.dumps(row) + "\n")
    (project / "data/test.jsonl").write_text(json.dumps(train[1].to_row()) + "\n")
    files = ("agent_data.train_file=data/train.jsonl", "agent_data.test_file=data/test.jsonl")
    with pytest.raises(DatasetError, match=r"^data/train.jsonl:1: meta 'turns'\[1\]: the task answers"):
        splits(_params("agent_data.task=examples.guess_number", *files), "agent_data")


SHOP = """
from tasks.data.environments import Tool
from tasks.data.problems import Example

TOOLS = [Tool("price", "The unit price of an item.",
              {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
              lambda item: "3")]


def generate(rng, cfg):
    n = rng.randint(1, 99)
    solution = f"<think>{n}*3={3 * n}</think><answer>{3 * n}</answer>"
    call = '<tool_call>{"name": "price", "arguments": {"item": "pen"}}</tool_call>'
    turns = [{"role": "assistant", "content": call}, {"role": "tool", "content": "4"}]  # its tool says 3
    return Example("shop", f"{n} pens cost?", str(3 * n), solution,
                   {"turns": [*turns, {"role": "assistant", "content": solution}]})


def difficulty(example):
    return "one"


def score(example, response):
    return True, response.endswith(f"<answer>{example.answer}</answer>")
"""


def test_a_generated_trace_is_replayed_too_naming_its_split_and_row(project, monkeypatch):
    """A task whose generator writes a reply its own tool would not give is refused before any row is written."""
    (project / "shop.py").write_text(SHOP)
    monkeypatch.syspath_prepend(str(project))
    params = _params("agent_data.task=shop", "agent_data.num_train=3", "agent_data.num_test=2")
    with pytest.raises(DatasetError, match=r"^agent_data's generated train row 1: meta 'turns'\[1\]: the task answers"):
        splits(params, "agent_data")
