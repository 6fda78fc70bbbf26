"""The rules a params file's task modules must meet (``task.name``, ``agent_data.task``): each imports and defines
what a task must, the agent pipeline's has tools or an environment, and what a task cannot generate comes from
files."""

from collections.abc import Iterator

from tasks.common.config import Params


def task_errors(params: Params) -> Iterator[str]:
    """Each task module (``task.name``, ``agent_data.task``) imports and defines what a task must, and what it
    cannot generate comes from files."""
    from tasks.data.environments import agent_task_errors, is_agent_task
    from tasks.data.problems import TaskError, grades_episodes, task_module

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
        if key == "task.name" and params.dpo.pairs == "verifier_separated" and grades_episodes(module):
            yield (
                f"dpo.pairs: verifier_separated verifies each response alone, but the task {name!r} grades whole "
                "episodes, which preference pairs do not keep; train on all pairs"
            )
        if not callable(getattr(module, "generate", None)):
            for file_key in ("train_file", "test_file"):
                if getattr(getattr(params, data), file_key) is None:
                    yield (
                        f"{data}.{file_key}: the task {name!r} generates no problems (no generate()): name your rows"
                    )


def reasoning_gym_errors(params: Params) -> Iterator[str]:
    """Each of ``task.reasoning_gym.datasets`` is one of reasoning-gym's, its config one it takes; and the built-in
    tiny model's character tokenizer knows every character of its problems (each unknown one would read alike)."""
    import dataclasses

    from reasoning_gym.factory import DATASETS

    from models import build_char_tokenizer
    from tasks.data.problems.reasoning_gym_family import config_json, item

    datasets = params.task.reasoning_gym.datasets
    if not datasets:
        yield "task.reasoning_gym.datasets: empty; name at least one of reasoning-gym's datasets"
    known = {token for token in build_char_tokenizer().get_vocab() if len(token) == 1}
    for name, spec in sorted(datasets.items()):
        key = f"task.reasoning_gym.datasets.{name}"
        if name not in DATASETS or name == "composite":
            choices = ", ".join(sorted(set(DATASETS) - {"composite"}))
            several = " (several datasets with weights are the composite)" if name == "composite" else ""
            yield f"{key}: not a reasoning-gym dataset{several} (choices: {choices})"
            continue
        knobs = sorted(field.name for field in dataclasses.fields(DATASETS[name][1]) if field.name not in _OURS)
        for knob in sorted(set(spec.config) - set(knobs)):
            where = _OURS.get(knob, f"not a knob of {name} (choices: {', '.join(knobs)})")
            yield f"{key}.config.{knob}: {where}"
        if set(spec.config) - set(knobs):
            continue
        try:
            problems = [item(name, config_json(spec.config), seed)[1] for seed in range(_CHARACTER_SAMPLE)]
        except Exception as error:  # the dataset's own check of its config, in its own words
            yield f"{key}.config: reasoning-gym refuses it ({type(error).__name__}: {error})"
            continue
        if params.base.model_path is None:
            lacking = {char for problem in problems for char in _text(problem)} - known
            if lacking:
                shown = ", ".join(repr(c) for c in sorted(lacking)[:8])
                yield (
                    f"{key}: its problems hold characters the built-in tiny model's tokenizer lacks ({shown}); run it "
                    "on a model of your own (base.model_path: SmolLM2 in examples/smollm2.args)"
                )


# A dataset's config keys that alignflow sets: the sizes and the seed are the data stage's.
_OURS = {
    "size": "the sizes are data.num_train and data.num_test",
    "seed": "the seed is params' seed (the data stage draws the items)",
}
_CHARACTER_SAMPLE = 16  # items whose characters are checked against the tiny model's tokenizer


def _text(item: dict) -> str:
    return item["question"] + str(item["answer"])


def textarena_errors(params: Params) -> Iterator[str]:
    """``task.textarena.game`` is one of TextArena's games and plays here, single-player and offline (some games
    download word lists at run time, and those cannot)."""
    import difflib

    from tasks.data.problems.textarena_family import Game, registry

    game = params.task.textarena.game
    try:
        registry()
    except ImportError:
        yield 'task.textarena.game: TextArena is not installed; pip install -e ".[textarena]" (README)'
        return
    if game not in registry():
        close = difflib.get_close_matches(game, sorted(registry()), n=5, cutoff=0.5)
        yield (
            f"task.textarena.game: {game!r} is not a TextArena game"
            + (f" (did you mean {', '.join(close)}?)" if close else "")
            + "; docs/agents.md lists the single-player games that run offline"
        )
        return
    try:
        Game(game, 0)
    except Exception as error:  # the game's own refusal: two players needed, a word list to download
        first = str(error).strip().splitlines()
        reason = next((line.strip() for line in first if line.strip() and set(line.strip()) != {"*"}), "")
        yield (
            f"task.textarena.game: {game!r} does not play here single-player and offline ({type(error).__name__}: "
            f"{reason[:160]}); docs/agents.md lists the games that do"
        )
