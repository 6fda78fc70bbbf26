"""One count of tool errors, whoever answers the calls: the tool host, or a task's own world that declares the same
tools. A malformed call, an unknown tool, an error observation and a raising step() each count once."""

import importlib
import sys
import textwrap

import pytest
from test_episodes import EXAMPLES, Scripted, call

from models import build_char_tokenizer
from tasks.rollout.engine import Sampling
from tasks.rollout.episodes import run_episodes

# Tools answered by the host: an adder, and a till that refuses in the task's own words.
HOSTED = """
from tasks.data.environments import Tool

NUMBERS = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}

def add(a, b):
    return {"sum": a + b}

def till():
    return "error: the till is closed"

TOOLS = [Tool("add", "Add two numbers.", NUMBERS, add), Tool("till", "Open the till.", {"type": "object"}, till)]

def score(example, response):
    return True, response.strip() == example.answer

def difficulty(example):
    return "any"
"""

# The same tools declared, answered by a world of the task's own, which words a call it cannot serve its own way
# (not as an error observation) and raises on "boom".
WORLD = (
    HOSTED
    + """
from tasks.data.environments import Step, parse_tool_call

class Desk:
    def reset(self, example):
        return None

    def step(self, action):
        if action == "boom":
            raise RuntimeError("boom")
        call = parse_tool_call(action, {tool.name: tool.parameters for tool in TOOLS})
        if call is None:
            return Step(None, done=True)
        if isinstance(call, str):
            return Step("pardon?")
        name, arguments = call
        function = {tool.name: tool.function for tool in TOOLS}[name]
        result = function(**arguments)
        return Step(result if isinstance(result, str) else str(result["sum"]))

def environment(example):
    return Desk()
"""
)

TURNS = [
    '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>',  # not JSON
    call("subtract", '{"a": 1, "b": 2}'),  # no such tool
    call("till"),  # an error observation
    call("add", '{"a": 1, "b": 2}'),  # served
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}',  # never closed
    "46",
]


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tool_error_tasks")
    for name, source in {"hosted_tools_task": HOSTED, "world_tools_task": WORLD}.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(folder))
    return importlib.import_module("hosted_tools_task"), importlib.import_module("world_tools_task")


def play(module, turns, examples=EXAMPLES[:1]):
    return run_episodes(
        Scripted(build_char_tokenizer(), turns), examples, module, Sampling(64), 10, 4096, tool_timeout_seconds=5.0
    )


def test_a_world_with_tools_counts_calls_and_errors_as_the_tool_host_does(modules):
    (hosted,), (world,) = (play(module, TURNS) for module in modules)
    assert (hosted.turns, hosted.tool_calls, hosted.tool_errors) == (6, 5, 4)
    assert (world.turns, world.tool_calls, world.tool_errors) == (hosted.turns, hosted.tool_calls, hosted.tool_errors)
    assert [m["content"] for m in world.messages if m["role"] == "tool"][2:4] == ["error: the till is closed", "3"]
    assert world.final_text == hosted.final_text == "46"


def test_a_raising_step_is_one_tool_error_and_ends_its_episode(modules):
    _, world = modules
    raised, answered = play(world, [call("add", '{"a": 1, "b": 2}'), ("boom", "46")], EXAMPLES)
    assert (raised.turns, raised.tool_calls, raised.tool_errors) == (2, 1, 1)
    assert "world_tools_task.environment().step() failed: RuntimeError: boom" in raised.messages[-1]["content"]
    assert (answered.turns, answered.tool_calls, answered.tool_errors, answered.final_text) == (2, 1, 0, "46")
