"""The rules a params file's task modules must meet (``task.name``, ``agent_data.task``): each imports and defines
what a task must, the agent pipeline's has tools or an environment, and what a task cannot generate comes from
files."""

from collections.abc import Iterator

from tasks.common.config import Params


def task_errors(params: Params) -> Iterator[str]:
    """Each task module (``task.name``, ``agent_data.task``) imports and defines what a task must, and what it
    cannot generate comes from files."""
    from tasks.data.environments import agent_task_errors, is_agent_task
    from tasks.data.problems import TaskError, task_module

    for key, name, data in (
        ("task.name", params.task.name, "data"),
        ("agent_data.task", params.agent_data.task, "agent_data"),
    ):
        try:
            module = task_module(name)
        except TaskError as error:
            yield str(error).replace("task.name:", f"{key}:", 1)
            continue
        yield from agent_task_errors(module, name, key)
        if data == "agent_data" and not is_agent_task(module):
            yield (
                f"{key}: the task module {name!r} has neither TOOLS nor an environment(), so the agent pipeline would "
                "play single turns; name a task with tools or an environment (docs/agents.md), or run its task as "
                "task.name"
            )
        if not callable(getattr(module, "score", None)):  # a general row of no task may lack one; the task may not
            yield (
                f"{key}: the task module {name!r} lacks score(), the verifier eval and the RL rewards grade "
                "responses with (docs/tasks.md)"
            )
        if not callable(getattr(module, "generate", None)):
            for file_key in ("train_file", "test_file"):
                if getattr(getattr(params, data), file_key) is None:
                    yield (
                        f"{data}.{file_key}: the task {name!r} generates no problems (no generate()): name your rows"
                    )
