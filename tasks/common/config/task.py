"""The params section of the task: what the model is asked (a built-in family with its settings, or a module of
your own), and how a prompt is put to it (the chat template, the system prompt)."""

from __future__ import annotations

from typing import Annotated, Any

from tasks.common.config.fields import MadeOf, OneOf, mapping, param, schema_section, section

CHAT_TEMPLATE_MODES = ("auto", "always", "never")  # not on/off: YAML reads those as booleans
# A module path; whether it imports is checked with the rules.
TASK_MODULE_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"


@schema_section
class ArithmeticConfig:
    digits: int = param(3, "Digits per operand (the multiplier of '*' is one digit).", ge=1, le=12)
    ops: Annotated[str, MadeOf("+-*")] = param("+-*", "Operations to draw from, any of '+', '-', '*'.")


@schema_section
class CountdownConfig:
    count: int = param(3, "Numbers given per puzzle; each must be used exactly once.", ge=2, le=6)
    max_number: int = param(40, "Numbers are drawn from 1..max_number.", ge=2)
    max_target: int = param(100, "Upper bound on intermediate products, which bounds the target.", ge=10)
    ops: Annotated[str, MadeOf("+-*/")] = param(
        "+-", "Operations solutions use, any of '+', '-', '*', '/'; must include '+'."
    )


@schema_section
class ReasoningGymDataset:
    weight: float = param(1.0, "Its share of the drawn problems (the datasets' weights are normalised).", gt=0)
    config: dict[str, Any] = mapping(
        dict,
        "The dataset's own config (its difficulty knobs: min_animals, max_animals, ...), as reasoning_gym's "
        "create_dataset takes it; the sizes and the seed are data's (num_train, num_test) and seed.",
    )


@schema_section
class ReasoningGymConfig:
    datasets: dict[str, ReasoningGymDataset] = mapping(
        lambda: {"leg_counting": ReasoningGymDataset()},
        "reasoning-gym datasets by name, each with its weight and config: one is a task, several a weighted "
        "composite (docs/tasks.md). The file's mapping replaces this default rather than adding to it.",
    )


@schema_section
class TextArenaConfig:
    game: str = param(
        "GuessTheNumber-v0",
        "The single-player TextArena game, by its id (GuessTheNumber-v0, TowerOfHanoi-v0, Mastermind-v0, ...; "
        "docs/agents.md lists those that run offline). Each row is one game seeded from the data stage's seed.",
        min_length=1,
    )
    forfeit_reward: float | None = param(
        0.0,
        "What a game lost to invalid moves pays the player. TextArena pays its progress so far (GuessTheNumber: how "
        "close the last valid guess was), which RL learns to collect by forfeiting once close (docs/agents.md); "
        "null: TextArena's own reward.",
    )


@schema_section
class TaskConfig:
    name: str = param(
        "countdown",
        "The task: a built-in problem family (arithmetic, countdown, reasoning_gym, textarena) or a module of your "
        "own by its import path from the project directory (examples.word_problems; docs/tasks.md).",
        pattern=TASK_MODULE_PATTERN,
    )
    arithmetic: ArithmeticConfig = section(ArithmeticConfig, "Settings of the arithmetic family.")
    countdown: CountdownConfig = section(CountdownConfig, "Settings of the countdown family.")
    reasoning_gym: ReasoningGymConfig = section(
        ReasoningGymConfig, "Settings of the reasoning_gym family: reasoning-gym's generated datasets as a task."
    )
    textarena: TextArenaConfig = section(
        TextArenaConfig, "Settings of the textarena family: a single-player TextArena game as an agent task."
    )
    chat_template: Annotated[str, OneOf(CHAT_TEMPLATE_MODES)] = param(
        "auto",
        "Ask through the tokenizer's chat template (an instruct model answers best as it was trained to be asked): "
        "auto when the tokenizer has one, always to require one, never to send the bare prompt.",
    )
    system_prompt: str | None = param(
        None, "The system message before each prompt, with a chat template; null keeps the template's own default."
    )
    response_prefix: str = param(
        "",
        "Text that opens every response, written at the end of the prompt for the model to continue (R1-Zero's "
        "'<think>': a base model that never starts the format is started in it); verifiers, judges and the data "
        "read each response with it in front, so worked solutions must start with it. Single-turn tasks only: an "
        "agent's episode opens its turns itself.",
    )
