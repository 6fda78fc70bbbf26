"""Agent tasks and settings refused before any stage: a bad task module (tools, parameters, environment) names what
is wrong, agent.max_turns below one names the key, and a tokenizer that cannot write the tool-call tags is an
error."""

import re
import sys
import textwrap
import types

import pytest
from test_episodes import ECHO, FILES, TOOLBOX

from models import build_char_tokenizer
from tasks.common.config import ConfigError
from tasks.data.environments import check_tool_tags
from tasks.data.problems import TaskError, task_module
from tasks.params.load import load_params


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (TOOLBOX.replace("def score(", "def not_score("), "lacks score()"),
        (ECHO.replace("def environment(example):\n    return Echo()", "environment = 3"), "environment is not a func"),
        (
            TOOLBOX.replace('Tool(f.__name__, "Misbehaves."', 'Tool("add", "Misbehaves."'),
            "two tools in TOOLS are named",
        ),
        (TOOLBOX.replace("NOTHING = {", "NOTHING = {'bad': {1, 2}, "), "'hang''s parameters are not JSON-serialisable"),
        (
            TOOLBOX.replace('NOTHING = {"type": "object"', 'NOTHING = {"type": "objekt"'),
            "parameters are not a JSON schema",
        ),
        (
            TOOLBOX.replace('NOTHING = {"type": "object"', 'NOTHING = {"type": "string"'),
            "must be the schema of an object",
        ),
        (
            TOOLBOX.replace('def add(a, b):\n    return {"sum": a + b}', 'def add(a, c):\n    return {"sum": a + c}'),
            "'add''s function(a, c) does not take the declared parameter 'b'",
        ),
        (
            TOOLBOX.replace(
                'def add(a, b):\n    return {"sum": a + b}', 'def add(a, b, c):\n    return {"sum": a + b}'
            ),
            "'add''s function(a, b, c) needs 'c', which parameters do not declare",
        ),
    ],
)
def test_a_bad_agent_task_is_an_error_naming_what_is_wrong(tmp_path, monkeypatch, source, message):
    (tmp_path / "bad_agent_task.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "bad_agent_task", raising=False)
    task_module.cache_clear()
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_params("params.yaml", ["task.name=bad_agent_task", *FILES])


def test_max_turns_below_one_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match="agent.max_turns"):
        load_params("params.yaml", ["agent.max_turns=0"])


def test_tool_call_tags_a_tokenizer_cannot_write_are_an_error():
    with_tools, without = types.SimpleNamespace(TOOLS=[]), types.SimpleNamespace()
    with pytest.raises(TaskError, match="cannot write the tool-call tags"):
        check_tool_tags(with_tools, _Lossy(build_char_tokenizer()))
    check_tool_tags(with_tools, build_char_tokenizer())  # the tiny model's tokenizer writes them
    check_tool_tags(without, _Lossy(build_char_tokenizer()))  # a task without tools calls none


class _Lossy:
    """A tokenizer that loses '<' on the way back: the tags cannot survive it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text, add_special_tokens=False):
        return self.tokenizer(text, add_special_tokens=add_special_tokens)

    def decode(self, ids, skip_special_tokens=False):
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens).replace("<", "?")
