"""Tasks a model solves over several turns: tools it calls, and interactive environments with hidden state.

A task module (docs/tasks.md, docs/agents.md) may define, besides ``score``:

- ``TOOLS: list[Tool]``: functions the model may call. Without an ``environment`` such a task gets the tool
  environment: each model turn is read for one call in the Hermes/Qwen format
  ``<tool_call>{"name": "...", "arguments": {...}}</tool_call>``; a call runs the tool and its result (a str as is,
  anything else as JSON) is the next observation; a turn without a call is the final answer. A malformed call (bad
  JSON, a ``<tool_call>`` never closed, an unknown tool, arguments other than the declared ones) and a result JSON
  cannot carry (NaN, infinity) are answered with an error observation and counted, never raised. ``parameters``
  must be a JSON schema of an object whose properties the function takes by name: checked when params load.
- ``environment(example) -> Environment``: a world of its own, given each whole model turn (``step``), answering
  with an observation, a reward and whether the episode is over. It should be deterministic given its example and
  the actions it received: a run is then reproducible, and a world lost with its process is rebuilt by replaying.
  A world may declare ``TOOLS`` too and answer the calls itself: its turns are counted as the tool host's are
  (``HostedEnvironment``).

Tools and environments run in a sandbox process (``tasks/common/sandbox.py``, as the reward functions do), under
``agent.tool_timeout_seconds`` per call and ``agent.tool_output_chars`` per observation: a call that hangs, raises,
kills its process or answers too much becomes an error observation and a counted tool error; the run goes on.
"""

import importlib
import inspect
import json
import math
import numbers
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from tasks.common.project_path import project_first_on_path
from tasks.common.sandbox import Handler, Sandbox, SandboxDied
from tasks.data.problems import Example, TaskError
from tasks.data.step import Step

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
EXAMPLE_ARGUMENT = "example"  # a tool function's parameter the host fills with the episode's Example
_TOOL_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class Tool:
    """A function the model may call: ``parameters`` is the JSON schema of its arguments object (the names under
    ``properties``, those it cannot do without under ``required``); ``function(**arguments)`` returns a str or
    anything JSON-serialisable. A function that also takes ``example`` is handed the episode's ``Example`` (its
    ``meta`` holds a row's hidden data: a price list, a document, a database row), which the model never sees."""

    name: str
    description: str
    parameters: dict
    function: Callable[..., Any]


class Environment(Protocol):
    def reset(self, example: Example) -> str | None:
        """Start an episode of ``example``; the opening observation (joined to the prompt), or None."""
        ...

    def step(self, action: str) -> Step:
        """The answer to the model's whole turn ``action``."""
        ...


def is_agent_task(module: ModuleType) -> bool:
    """Whether ``module`` is a multi-turn task: it declares tools or an environment."""
    return hasattr(module, "TOOLS") or hasattr(module, "environment")


def agent_task_errors(module: ModuleType, name: str, key: str = "task.name") -> Iterator[str]:
    """What keeps the task module ``module`` (the params ``key`` = ``name``) from serving episodes, one error a
    problem, each naming the function or the tool."""
    where = f"{key}: the task module {name!r}"
    if hasattr(module, "environment") and not callable(module.environment):
        yield f"{where}: environment is not a function environment(example) -> Environment (docs/agents.md)"
    if not hasattr(module, "TOOLS"):
        return
    tools = module.TOOLS
    if not isinstance(tools, list | tuple) or not all(isinstance(tool, Tool) for tool in tools):
        yield f"{where}: TOOLS must be a list of tasks.data.environments.Tool, got {tools!r:.80}"
        return
    seen = set()
    for tool in tools:
        if tool.name in seen:
            yield f"{where}: two tools in TOOLS are named {tool.name!r}; a call names the tool it means"
        seen.add(tool.name)
        if not callable(tool.function):
            yield f"{where}: the tool {tool.name!r}'s function is not callable"
        try:
            json.dumps(tool.parameters)
        except (TypeError, ValueError) as error:
            yield f"{where}: the tool {tool.name!r}'s parameters are not JSON-serialisable ({error})"
            continue
        if not isinstance(tool.parameters, dict):
            yield f"{where}: the tool {tool.name!r}'s parameters must be a JSON schema object, got {tool.parameters!r}"
            continue
        yield from (f"{where}: the tool {tool.name!r}'s {problem}" for problem in _parameter_errors(tool))


def _parameter_errors(tool: Tool) -> Iterator[str]:
    """What keeps ``tool.parameters`` from being the JSON schema of the arguments ``tool.function`` takes."""
    import jsonschema  # a task with tools only

    try:
        jsonschema.validators.validator_for(tool.parameters).check_schema(tool.parameters)
    except jsonschema.SchemaError as error:
        yield f"parameters are not a JSON schema: {error.message} (at {'/'.join(map(str, error.path)) or 'the top'})"
        return
    if tool.parameters.get("type") != "object" or not isinstance(tool.parameters.get("properties", {}), dict):
        yield 'parameters must be the schema of an object: {"type": "object", "properties": {...}}'
        return
    declared = tool.parameters.get("properties", {})
    if unknown := [name for name in tool.parameters.get("required", []) if name not in declared]:
        yield f"parameters require {', '.join(map(repr, unknown))}, which properties do not declare"
    try:
        signature = inspect.signature(tool.function)
    except (TypeError, ValueError):  # a builtin without a signature: its calls will say
        return
    kinds = {parameter.name: parameter for parameter in signature.parameters.values()}
    takes_any = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in kinds.values())
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    for name in declared:
        if not takes_any and (name not in kinds or kinds[name].kind not in by_name):
            yield f"function{signature} does not take the declared parameter {name!r}"
    if EXAMPLE_ARGUMENT in declared:
        yield f"parameters declare {EXAMPLE_ARGUMENT!r}, the episode's example, which the host passes, not the model"
    for name, parameter in kinds.items():
        supplied = name in declared or name == EXAMPLE_ARGUMENT
        if parameter.kind in by_name and parameter.default is inspect.Parameter.empty and not supplied:
            yield f"function{signature} needs {name!r}, which parameters do not declare"


def takes_example(tool: Tool) -> bool:
    """Whether ``tool.function`` takes the episode's example (``example=``) beside the model's arguments."""
    try:
        return EXAMPLE_ARGUMENT in inspect.signature(tool.function).parameters
    except (TypeError, ValueError):
        return False


def check_tool_tags(module: ModuleType, tokenizer: Any) -> None:
    """For a task with ``TOOLS``: TaskError unless the tool-call tags survive encoding then decoding with
    ``tokenizer``, else the model could never write a call that parses. A stage that plays episodes checks once,
    before the first."""
    if not hasattr(module, "TOOLS"):
        return
    text = f'{TOOL_CALL_OPEN}{{"name": "f", "arguments": {{}}}}{TOOL_CALL_CLOSE}'
    decoded = tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
    if TOOL_CALL_OPEN not in decoded or TOOL_CALL_CLOSE not in decoded:
        raise TaskError(
            f"the model's tokenizer cannot write the tool-call tags {TOOL_CALL_OPEN}...{TOOL_CALL_CLOSE}: {text!r} "
            f"decodes as {decoded!r}"
        )


def parse_tool_call(text: str, tools: dict[str, dict]) -> tuple[str, dict] | str | None:
    """The (tool name, arguments) ``text`` calls, an error message for a malformed call, or None without a call;
    ``tools``: each tool's declared parameters by name."""
    match = _TOOL_CALL.search(text)
    if match is None:
        if TOOL_CALL_OPEN in text:  # a call begun is a call, not the final answer
            return f"the tool call is not closed with {TOOL_CALL_CLOSE}"
        return None
    try:
        call = json.loads(match.group(1))
    except json.JSONDecodeError as error:
        return f"the tool call is not valid JSON ({error})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'a tool call is {"name": "<tool>", "arguments": {...}}'
    name, arguments = call["name"], call.get("arguments", {})
    if name not in tools:
        return f"there is no tool {name!r} (the tools: {', '.join(tools)})"
    if not isinstance(arguments, dict):
        return f"the arguments of {name!r} must be an object, got {arguments!r:.80}"
    declared = tools[name].get("properties", {})
    unknown = [key for key in arguments if key not in declared]
    missing = [key for key in tools[name].get("required", []) if key not in arguments]
    if unknown or missing:
        return f"{name!r} takes {', '.join(declared) or 'no arguments'}: " + "; ".join(
            [*(f"unknown argument {key!r}" for key in unknown), *(f"missing argument {key!r}" for key in missing)]
        )
    return name, arguments


def _capped(text: str, output_chars: int, what: str) -> tuple[str, str]:
    if len(text) > output_chars:
        return "error", f"{what} gave {len(text)} characters, over agent.tool_output_chars={output_chars}"
    return "ok", text


def _observation(value: Any) -> str:
    """A tool's result as the model reads it: a str as is, anything else as JSON (a NaN or an infinity, which JSON
    has no word for, is an error)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError(f"the result {value!r:.80} holds a NaN or an infinity, which JSON cannot carry") from None


def _checked_step(step: Any) -> Step:
    """``step`` if it is a Step of a str-or-None observation, a finite number and a bool; else ValueError."""
    if not isinstance(step, Step):
        raise ValueError(f"step() returned {step!r:.80}, not a Step")
    if step.observation is not None and not isinstance(step.observation, str):
        raise ValueError(f"step() returned the observation {step.observation!r:.80}, not a str or None")
    if not isinstance(step.reward, numbers.Real) or not math.isfinite(step.reward):
        raise ValueError(f"step() returned the reward {step.reward!r}, not a finite number")
    if not isinstance(step.done, bool):
        raise ValueError(f"step() returned done={step.done!r}, not a bool")
    return step


def _environment_handler(module_name: str, output_chars: int) -> Handler:
    """The sandbox's handler: ("tool", name, arguments), ("reset", key, example), ("step", key, action) and
    ("close", key), each answered ("ok", value) or ("error", message)."""
    with project_first_on_path():
        module = importlib.import_module(module_name)
    tools = {tool.name: tool.function for tool in getattr(module, "TOOLS", [])}
    with_example = {tool.name for tool in getattr(module, "TOOLS", []) if takes_example(tool)}
    worlds: dict[int, Any] = {}

    def answer(request: tuple) -> tuple:
        kind, key, argument = request
        if kind == "close":
            worlds.pop(key, None)
            return "ok", None
        try:
            if kind == "tool":
                arguments, example = argument
                extra = {EXAMPLE_ARGUMENT: example} if key in with_example else {}
                return _capped(_observation(tools[key](**arguments, **extra)), output_chars, f"the tool {key!r}")
            if kind == "reset":
                worlds[key] = module.environment(argument)
                opening = worlds[key].reset(argument)
                if opening is not None and not isinstance(opening, str):
                    raise ValueError(f"reset() returned {opening!r:.80}, not a str or None")
                return ("ok", None) if opening is None else _capped(opening, output_chars, "reset()")
            step = _checked_step(worlds[key].step(argument))
            if step.observation is None:
                return "ok", step
            status, text = _capped(step.observation, output_chars, "step()")
            return (status, Step(text, step.reward, step.done)) if status == "ok" else (status, text)
        except Exception as error:  # the user's code failing is the episode's tool error, not the run's
            return "error", f"{type(error).__name__}: {error}"

    return answer


class EnvironmentHost:
    """The sandbox every episode's tools and environment run in, and the environments of a batch of episodes.

    A call that overruns ``timeout`` or kills the process fails alone: the next call starts a fresh process, where
    the worlds still in play are rebuilt by replaying their actions (environments are deterministic)."""

    def __init__(self, module: ModuleType, timeout: float, output_chars: int):
        self.module, self.timeout = module, timeout
        self.tools = {tool.name: tool.parameters for tool in getattr(module, "TOOLS", [])}
        self._sandbox = Sandbox(_environment_handler, (module.__name__, output_chars))
        self._worlds: dict[int, WorldEnvironment] = {}

    def environment(self, key: int) -> "HostedEnvironment":
        """A fresh environment of the task for the episode ``key``."""
        if callable(getattr(self.module, "environment", None)):
            self._worlds[key] = WorldEnvironment(self, key)
            return self._worlds[key]
        return ToolEnvironment(self)

    def call(self, kind: str, key: Any, argument: Any) -> tuple[str, Any]:
        """("ok", the answer) or ("error", why) of one request to the sandbox."""
        while not self._sandbox.running:
            self._sandbox.start()
            for world in list(self._worlds.values()):
                world.lost = self._replay(world)
                if not world.lost:
                    continue
                del self._worlds[world.key]
                if not self._sandbox.running:  # the replay killed it: start again with the worlds left
                    break
        return self._answer((kind, key, argument))

    def _replay(self, world: "WorldEnvironment") -> str:
        """Rebuild ``world`` in the fresh sandbox from its history; why it is lost, or "" when every request
        answered as it did the first time."""
        for request, answer in world.history():
            again = self._answer(request)
            if not self._sandbox.running:
                return "lost with a sandbox that died"
            if again != answer:
                return (
                    f"lost with its sandbox, and replaying its {request[0]} answered {again[1]!r:.80} where it had "
                    f"answered {answer[1]!r:.80}: environment() is not deterministic given its example and actions"
                )
        return ""

    def _answer(self, request: tuple) -> tuple[str, Any]:
        try:
            answered, result = self._sandbox.call(request, self.timeout)
        except SandboxDied:
            return "error", "its process died"
        if not answered:
            return "error", f"over agent.tool_timeout_seconds={self.timeout:g}"
        return result

    def release(self, key: int) -> None:
        if self._worlds.pop(key, None) is not None and self._sandbox.running:
            self.call("close", key, None)

    def close(self) -> None:
        self._sandbox.close()

    def __enter__(self) -> "EnvironmentHost":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


ERROR_PREFIX = "error:"  # an observation beginning so is an error observation: the turn's call failed


class HostedEnvironment:
    """An ``Environment`` run through the host, counting the tool calls it saw and the turns that failed, the same
    way whoever answers them (the tool host or the task's own world): a turn that begins a ``<tool_call>`` is a
    call; a turn failed when it is a call malformed for the task's ``TOOLS``, when its answer is an error
    observation (``error: ...``, the host's or the task's own), or when answering it raised."""

    def __init__(self, host: EnvironmentHost):
        self.host, self.tool_calls, self.tool_errors = host, 0, 0
        self.failure = ""  # why the episode's world failed, when it did

    def _count(self, action: str, call: tuple[str, dict] | str | None, answer: Step | None) -> None:
        """Count the turn ``action`` (parsed as ``call``), answered ``answer`` (None: answering it raised)."""
        self.tool_calls += call is not None or TOOL_CALL_OPEN in action
        error_observation = answer is not None and (answer.observation or "").startswith(ERROR_PREFIX)
        self.tool_errors += answer is None or isinstance(call, str) or error_observation


class ToolEnvironment(HostedEnvironment):
    """The environment of a task with tools and no world: each turn's tool call is run (a tool taking ``example`` is
    handed the episode's), a turn without one ends."""

    example: Example | None = None

    def reset(self, example: Example) -> str | None:
        self.example = example
        return None

    def step(self, action: str) -> Step:
        call = parse_tool_call(action, self.host.tools) if self.host.tools else None
        if call is None:
            answer = Step(None, done=True)
        elif isinstance(call, str):
            answer = Step(f"{ERROR_PREFIX} {call}")
        else:
            name, arguments = call
            status, text = self.host.call("tool", name, (arguments, self.example))
            answer = Step(text if status == "ok" else f"{ERROR_PREFIX} the tool {name!r} failed: {text}")
        self._count(action, call, answer)
        return answer


class WorldEnvironment(HostedEnvironment):
    """The task's own ``environment(example)``, living in the sandbox; a turn that fails there ends its episode
    (the world's state is unknown after it), counted as a tool error."""

    def __init__(self, host: EnvironmentHost, key: int):
        super().__init__(host)
        self.key, self.example, self.lost = key, None, ""
        self.answered: list[tuple[tuple, tuple]] = []  # (request, answer) of every step it took

    def reset(self, example: Example) -> str | None:
        status, opening = self.host.call("reset", self.key, example)
        if status == "error":
            raise TaskError(f"{self.host.module.__name__}.environment().reset() failed: {opening}")
        self.example, self.opening = example, (status, opening)  # from now on a fresh sandbox rebuilds it
        return opening

    def step(self, action: str) -> Step:
        call = parse_tool_call(action, self.host.tools) if self.host.tools else None
        request = ("step", self.key, action)
        status, step = ("error", self.lost) if self.lost else self.host.call(*request)
        if status == "error":
            self._count(action, call, None)
            self.host.release(self.key)
            self.failure = f"{self.host.module.__name__}.environment().step() failed: {step}"
            return Step(f"{ERROR_PREFIX} {self.failure}", done=True)
        self._count(action, call, step)
        self.answered.append((request, (status, step)))
        return step

    def history(self) -> list[tuple[tuple, tuple]]:
        """The requests that rebuild this world in a fresh sandbox, each with what it answered the first time (a
        replay must answer the same): its reset, then the actions it was given (none before its reset: the
        sandbox a batch's first reset starts holds no world yet)."""
        if self.example is None:
            return []
        return [(("reset", self.key, self.example), self.opening), *self.answered]
