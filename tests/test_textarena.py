"""TextArena's games as agent tasks (``task.textarena``): seeded games as rows, the solver's won games as worked traces
replayed at the data stage, the game as the episode's world, and ``score`` grading the episode by the game's reward."""

import json
import subprocess
from dataclasses import replace
from types import SimpleNamespace

import pytest

from tasks.common.config import ConfigError
from tasks.data.datasets import generate_splits
from tasks.data.problems import TaskError, score_credit, score_response
from tasks.data.problems import textarena_family as textarena
from tasks.data.trace_replay import trace_errors
from tests.conftest import REPO, make_project, report_json, warm

GAME = "GuessTheNumber-v0"
TASK = SimpleNamespace(name="textarena", textarena=SimpleNamespace(game=GAME, forfeit_reward=0.0))


def _games(count: int, seed: int = 0) -> list:
    _, test = generate_splits(TASK, 0, count, seed, "agent_data")
    return test


def test_rows_are_seeded_games_whose_solver_traces_win_them():
    games = _games(12)
    assert [g.to_row() for g in games] == [g.to_row() for g in _games(12)]  # the same seed, the same bytes
    assert [g.to_row() for g in games] != [g.to_row() for g in _games(12, seed=1)]
    for game in games:
        assert game.prompt.startswith(f"Game {game.meta['seed']}:\n") and "Guess The Number" in game.prompt
        assert textarena.mismatch(game) is None
        world = textarena.environment(game)
        world.reset(game)
        steps = [world.step(turn["content"]) for turn in game.meta["turns"] if turn["role"] == "assistant"]
        assert [s.observation for s in steps[:-1]] == [t["content"] for t in game.meta["turns"] if t["role"] == "user"]
        assert steps[-1].done and steps[-1].reward == textarena.WIN and not any(s.done for s in steps[:-1])
        assert len(steps) <= 5  # binary search over 1..20
    assert not list(trace_errors(textarena, [(f"row {i}", g) for i, g in enumerate(games)], 10.0, 10_000))


def test_a_trace_the_game_would_not_play_is_refused_naming_the_row():
    game = next(g for g in _games(12) if len(g.meta["turns"]) >= 3)  # a game of two guesses or more
    turns = [dict(t) for t in game.meta["turns"]]
    hint = turns[1]
    hint["content"] = hint["content"].replace("lower", "LOWER").replace("higher", "HIGHER")
    edited = replace(game, meta={**game.meta, "turns": turns})
    (error,) = trace_errors(textarena, [("data/games.jsonl:3", edited)], 10.0, 10_000)
    assert error.startswith("data/games.jsonl:3: meta 'turns'[1]: the task answers '[GAME] The target number is ")
    # a trace that stops one guess short of winning plays as recorded, but its episode is not a won game
    short = game.meta["turns"][:-2]
    lost = replace(game, solution=short[-1]["content"], meta={**game.meta, "turns": short})
    (error,) = trace_errors(textarena, [("row 1", lost)], 10.0, 10_000)
    assert error == "row 1: its episode does not pass textarena.score() (environment reward 0.0)"


def test_score_grades_the_episode_by_the_games_reward_and_refuses_a_response_alone():
    game = _games(1)[0]
    assert score_response(game, game.solution, env_reward=1.0) == (True, True)
    assert score_response(game, game.solution, env_reward=0.0) == (True, False)  # the same move, a lost game
    assert score_credit(game, "no move here", env_reward=-1.0) == (False, 0.0)
    with pytest.raises(TaskError, match="grades a whole episode"):
        score_response(game, game.solution)


@pytest.mark.parametrize("forfeit_reward", [0.0, None])
def test_a_game_lost_to_invalid_moves_pays_the_forfeit_reward_not_textarenas_progress(forfeit_reward):
    """GRPO on GuessTheNumber-v0-hardcore learnt to guess once, then forfeit with two invalid moves: TextArena paid
    the closeness of that guess (held-out mean reward 0.33 -> 0.72) and held-out wins fell from 0.325 to 0.045."""
    game = _games(1)[0]
    game = replace(game, meta={**game.meta, "forfeit_reward": forfeit_reward})
    world = textarena.environment(game)
    world.reset(game)
    target = world.env.state.game_state["game_number"]
    close = target + 1 if target < 20 else target - 1
    steps = [world.step(move) for move in (f"[{close}]", "[4", "[999]")]
    assert [s.done for s in steps] == [False, False, True]
    if forfeit_reward is None:  # TextArena's own reward: 1 - |guess - target| / 19
        assert steps[-1].reward == pytest.approx(1 - 1 / 19)
    else:
        assert steps[-1].reward == forfeit_reward == 0.0


def test_a_changed_prompt_is_not_the_game_its_meta_names():
    game = _games(1)[0]
    assert "is not the opening" in textarena.mismatch(replace(game, prompt=game.prompt.replace("20", "30")))


def _load(*overrides):
    from tasks.params.load import load_params

    return load_params(REPO / "params.yaml", ["agent_data.task=textarena", *overrides], runs=["agent"])


def test_a_game_textarena_lacks_or_that_cannot_play_here_is_refused_before_any_stage():
    assert _load().task.textarena.game == GAME
    with pytest.raises(ConfigError, match=r"task.textarena.game: 'GuessTheNumbr-v0' is not a TextArena game \(did"):
        _load("task.textarena.game=GuessTheNumbr-v0")
    # Wordle reads nltk's word list, which it would download: it cannot run offline
    with pytest.raises(ConfigError, match="task.textarena.game: 'Wordle-v0' does not play here single-player and"):
        _load("task.textarena.game=Wordle-v0")


@pytest.mark.slow
def test_repro_agent_plays_a_textarena_game_through_eval_with_its_reward_in_metrics_and_episodes(tmp_path):
    path = make_project(tmp_path)
    small = ["agent_data.num_train=24", "agent_data.num_test=4", "agent_sft.max_steps=4", "agent_grpo.steps=2"]
    args = ["alignflow", "repro", "agent", "@examples/textarena/tiny.args", *small]
    result = subprocess.run(args, cwd=path, env=warm(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = report_json(path)
    for model in ("agent_sft", "agent_grpo"):
        assert {"pass@1", "env_reward", "turns", "max_turns_rate"} <= set(report[model]), model
    played = [json.loads(line) for line in (path / "artifacts/agent_grpo/episodes.jsonl").read_text().splitlines()]
    assert played and all(row["prompt"].startswith("Game ") for row in played)
    for row in played:  # correct is a won game: the game's reward, whatever the final turn says
        assert row["correct"] == (row["env_reward"] == textarena.WIN)
    greedy = (path / "artifacts/agent_eval/agent_grpo/episodes.jsonl").read_text().splitlines()
    assert len(greedy) == 4 and all("env_reward" in json.loads(line) for line in greedy)
