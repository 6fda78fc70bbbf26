"""Worked traces replayed against their task before any stage trains on them: each row's ``meta["turns"]`` is played
through the task's tools or environment in the sandbox episodes use, and a trace whose calls the task would refuse
(not JSON, an unknown tool, undeclared arguments) or whose recorded replies differ from what the task answers is an
error naming its row (a tool's own error answer, recorded as the tool gives it, may be shown). SFT would otherwise
teach the model replies no episode will ever show it. For a task whose ``score`` grades whole episodes (a game), the
trace's episode must pass it: its final move wins."""

from collections.abc import Iterator
from types import ModuleType

from tasks.data.environments import EnvironmentHost, HostedEnvironment
from tasks.data.problems import Example, TaskError, grades_episodes, score_response, trace_turns


def trace_errors(
    module: ModuleType, rows: list[tuple[str, Example]], timeout: float, output_chars: int
) -> Iterator[str]:
    """``place: what differs`` for each (place, example) whose worked trace the task ``module`` does not
    reproduce."""
    by_episode = grades_episodes(module)
    with EnvironmentHost(module, timeout, output_chars) as host:
        for key, (place, example) in enumerate(rows):
            if example.meta.get("turns") is None:
                continue
            environment = host.environment(key)
            try:
                environment.reset(example)
                difference, env_reward = _first_difference(environment, trace_turns(example))
                won = not by_episode or score_response(example, example.solution, env_reward) == (True, True)
                if difference is None and not won:
                    difference = f"its episode does not pass {example.task}.score() (environment reward {env_reward})"
            except TaskError as error:  # the world's reset failed
                difference = str(error)
            finally:
                host.release(key)
            if difference is not None:
                yield f"{place}: {difference}"


def _first_difference(environment: HostedEnvironment, turns: list[tuple[str, str]]) -> tuple[str | None, float]:
    """Where the trace and the task part ways (a call the task refuses, a reply it would not give, or an episode it
    would end before the trace does; None when it plays out as recorded), and the environment's reward so far."""
    env_reward = 0.0
    for index, (role, text) in enumerate(turns):
        if role != "assistant":
            continue
        errors_before = environment.tool_errors
        step = environment.step(text)
        env_reward += step.reward
        recorded = turns[index + 1][1] if index + 1 < len(turns) else None
        # a trace may show a tool's error answer and the recovery from it, but not a call that fails otherwise
        if environment.tool_errors > errors_before and (step.done or step.observation != recorded):
            return f"meta 'turns'[{index}]: {(step.observation or '').removeprefix('error: ')}", env_reward
        if index == len(turns) - 1:
            return None, env_reward  # the final answer: what it earns is the verifier's business
        answer_role, recorded = turns[index + 1]
        if answer_role == "assistant" or step.observation is None or step.done:
            return f"meta 'turns'[{index}]: the task ends the episode at this turn, but the trace goes on", env_reward
        if step.observation != recorded:
            return (
                f"meta 'turns'[{index + 1}]: the task answers {step.observation!r:.80} where the trace says "
                f"{recorded!r:.80}",
                env_reward,
            )
    return None, env_reward
