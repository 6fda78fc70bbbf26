"""The agent examples: examples/calculator (a tool-using task), examples/guess_number (a game with hidden state) and
examples/shop (a tool reading its row's hidden prices).
Their generators are seeded, their worked traces replay against their own tool and environment, their verifiers
grade the final turn, the calculator evaluates integer arithmetic and nothing else, and every text they make is in
the tiny model's alphabet."""

import builtins
import json
import re
from types import SimpleNamespace

import pytest

import examples.calculator as calculator
import examples.guess_number as guess_number
import examples.shop as shop
from models.tokenizer import build_char_tokenizer
from tasks.data.datasets import generate_splits, read_examples, write_jsonl
from tasks.data.environments import EnvironmentHost, Step
from tasks.data.problems import Example, score_response

TASKS = ("examples.calculator", "examples.guess_number", "examples.shop")
_CALL = re.compile(r"<tool_call>(.*)</tool_call>", re.DOTALL)


def rows(task: str, seed: int = 0, num_train: int = 60, num_test: int = 20) -> list[Example]:
    train, test = generate_splits(SimpleNamespace(name=task), num_train, num_test, seed)
    return train + test


def assistant_turns(example: Example) -> list[str]:
    return [turn["content"] for turn in example.meta["turns"] if turn["role"] == "assistant"]


@pytest.mark.parametrize("task", TASKS)
def test_the_generators_are_seeded(task):
    first = [example.to_row() for example in rows(task)]
    assert first == [example.to_row() for example in rows(task)]
    assert first != [example.to_row() for example in rows(task, seed=1)]


@pytest.mark.parametrize("task", TASKS)
def test_generated_rows_pass_the_data_stage_checks_and_hold_a_trace_ending_in_the_solution(task, tmp_path):
    examples = rows(task)
    write_jsonl(tmp_path / "rows.jsonl", examples)
    assert read_examples(tmp_path / "rows.jsonl") == examples  # each solution passes score, each row its checks
    for example in examples:
        turns = example.meta["turns"]
        assert all(set(turn) == {"role", "content"} and isinstance(turn["content"], str) for turn in turns)
        assert [turn["role"] for turn in turns][::2] == ["assistant"] * ((len(turns) + 1) // 2)
        assert {turn["role"] for turn in turns[1::2]} <= {"tool", "user"}
        assert turns[-1] == {"role": "assistant", "content": example.solution}
        assert score_response(example, example.solution) == (True, True)


def test_calculator_traces_replay_against_its_tool():
    tools = {tool.name: tool for tool in calculator.TOOLS}
    for example in rows("examples.calculator"):
        call, observation, final = example.meta["turns"]
        parsed = json.loads(_CALL.fullmatch(call["content"])[1])
        assert (call["role"], observation["role"]) == ("assistant", "tool")
        assert tools[parsed["name"]].function(**parsed["arguments"]) == observation["content"] == example.answer
        a, b = map(int, re.fullmatch(r"What is (\d{3})\*(\d{2})\?", example.prompt).groups())
        assert example.answer == str(a * b) and calculator.mismatch(example) is None
        assert calculator.difficulty(example) in ("4-digit product", "5-digit product")


def test_the_calculator_verifier_grades_the_final_turn():
    example = rows("examples.calculator")[0]
    wrong = str(int(example.answer) + 1)
    assert calculator.score(example, example.solution) == (True, True)
    assert calculator.score(example, f"<think></think><answer>{example.answer}</answer>") == (True, True)
    assert calculator.score(example, f"<think></think><answer>{wrong}</answer>") == (True, False)
    assert calculator.score(example, example.meta["turns"][0]["content"]) == (False, False)  # still calling a tool
    assert calculator.score(example, example.answer) == (False, False)


@pytest.mark.parametrize(
    "expression, value",
    [
        ("347*86", "29842"),
        ("2+3*4", "14"),
        ("(2+3)*4", "20"),
        (" 12 - 30 ", "-18"),
        ("-5*-3", "15"),
        ("7", "7"),
        ("(" * 45 + "1" + ")" * 45, "1"),
    ],
)
def test_the_calculator_evaluates_integer_arithmetic(expression, value):
    assert calculator.calculate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('touch pwned')",
        "open('x').read()",
        "2**10",
        "9**9**9**9",
        "1/2",
        "7//2",
        "1.5*2",
        "abs(-3)",
        "1e9",
        "0x10",
        "2+",
        "(2+3",
        "2+3)",
        "",
        "   ",
        "2 3",
        "1" * 101,
        "(" * 60 + "1" + ")" * 60,
        42,
        None,
    ],
)
def test_the_calculator_refuses_what_is_not_integer_arithmetic_without_running_it(expression, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the calculator ran text as code")

    for name in ("eval", "exec", "compile", "__import__"):
        monkeypatch.setattr(builtins, name, refuse)
    answer = calculator.calculate(expression)
    assert answer.startswith("error: ")


def test_guess_number_traces_replay_against_its_environment_and_win_within_seven_turns():
    openings = []
    for example in rows("examples.guess_number", num_train=200):
        assert re.fullmatch(r"Game \d{5}: guess 1 to 100", example.prompt)
        game = guess_number.environment(example)
        assert game.reset(example) is None
        turns = example.meta["turns"]
        guesses = assistant_turns(example)
        assert len(guesses) <= guess_number.MAX_GUESSES
        for index, guess in enumerate(guesses):
            step = game.step(guess)
            if index + 1 < len(guesses):
                assert turns[2 * index + 1] == {"role": "user", "content": step.observation}
                assert (step.reward, step.done) == (0.0, False)
        assert (step.observation, step.reward, step.done) == ("correct", guess_number.win_reward(len(guesses)), True)
        assert game.format_errors == 0
        number = int(example.meta["number"])
        assert guess_number.difficulty(example) == f"{guess_number.binary_search_turns(number)}-turn"
        openings.append(guesses[0])
    # two players' won games: most open with the wasted guess (0.9 of the games x 64 numbers it wins of 100)
    wasted = openings.count(guess_number.guess_turn(1, 100, 1)) / len(openings)
    assert 0.45 < wasted < 0.7 and wasted + openings.count(guess_number.guess_turn(1, 100, 50)) / len(openings) == 1


def test_the_logged_opening_wins_fewer_games_in_more_turns_than_binary_search():
    assert all(guess_number.logged_search(n, 0.95) == guess_number.binary_search(n) for n in range(1, 101))
    logged = {number: guess_number.logged_search(number, 0.0) for number in range(1, 101)}  # the opening player's
    opened = {n: turns for n, turns in logged.items() if turns[0][2] == 1}
    assert len(opened) == 64 and all(len(turns) <= 7 for turns in logged.values())
    # the wasted opening, then halving 2..100; its won games take more turns on average than binary search's 100
    assert all(len(turns) == guess_number.binary_search_turns(n, 2, 100) + 1 for n, turns in opened.items() if n > 1)
    mean_turns = sum(map(len, opened.values())) / len(opened)
    assert mean_turns > sum(map(guess_number.binary_search_turns, range(1, 101))) / 100 + 0.2
    assert all(logged[n] == guess_number.binary_search(n) for n in set(logged) - set(opened))
    assert all(len(guess_number.opening_search(n)) == 8 for n in set(logged) - set(opened))


def test_binary_search_finds_every_number_within_seven_guesses():
    turns = [guess_number.binary_search_turns(number) for number in range(1, 101)]
    assert max(turns) == guess_number.worst_case_turns() == guess_number.MAX_GUESSES == 7
    assert guess_number.binary_search_turns(50) == 1 and sorted(set(turns)) == list(range(1, 8))
    for number in range(1, 101):
        game = guess_number.environment(Example("examples.guess_number", "p", str(number), "", {"number": number}))
        steps = [game.step(guess_number.guess_turn(*turn)) for turn in guess_number.binary_search(number)]
        assert steps[-1].done and not any(step.done or step.reward for step in steps[:-1])
        assert steps[-1].reward == (8 - len(steps)) / 7  # 1.0 won on the first guess, 1/7 on the seventh


def test_the_game_counts_unreadable_turns_and_ends_after_seven():
    example = Example("examples.guess_number", "p", "63", "", {"number": 63})
    game = guess_number.environment(example)
    for turn in ("50", "<answer>50</answer>", "<think></think><answer>fifty</answer>"):
        assert game.step(turn) == Step("format error", 0.0, False)
    assert game.format_errors == 3
    assert game.step("<think></think><answer>80</answer>").observation == "lower"
    assert game.step("<think></think><answer>10</answer>").observation == "higher"
    assert game.step("<think></think><answer>62</answer>").observation == "higher"
    last = game.step("<think></think><answer>64</answer>")
    assert (last.observation, last.reward, last.done) == ("lower", 0.0, True)  # the seventh turn ends the game
    game.reset(example)
    assert (game.turns, game.format_errors) == (0, 0)


def test_the_game_verifier_grades_the_final_guess():
    example = rows("examples.guess_number")[0]
    number = int(example.meta["number"])
    assert guess_number.score(example, example.solution) == (True, True)
    assert guess_number.score(example, f"<think>x</think><answer>{number}</answer>") == (True, True)
    assert guess_number.score(example, f"<think></think><answer>{number % 100 + 1}</answer>") == (True, False)
    assert guess_number.score(example, str(number)) == (False, False)


@pytest.mark.parametrize("module", [calculator, guess_number])
def test_traces_replay_through_the_sandboxed_environment_an_episode_runs_in(module):
    with EnvironmentHost(module, timeout=60, output_chars=1000) as host:
        for key, example in enumerate(rows(module.__name__)[:5]):
            environment = host.environment(key)
            assert environment.reset(example) is None
            turns = example.meta["turns"]
            for index in range(0, len(turns), 2):
                step = environment.step(turns[index]["content"])
                if index + 1 < len(turns):
                    assert (step.observation, step.done) == (turns[index + 1]["content"], False)
            guesses = len(assistant_turns(example))  # the calculator's last turn makes no call: the answer
            final = (None, 0.0, True) if module is calculator else ("correct", module.win_reward(guesses), True)
            assert (step.observation, step.reward, step.done) == final
            assert environment.tool_errors == 0
            host.release(key)


@pytest.mark.parametrize("task", TASKS)
def test_every_text_is_in_the_tiny_models_alphabet(task):
    tokenizer = build_char_tokenizer()
    examples = rows(task)
    texts = [text for e in examples for text in (e.prompt, e.answer, *[turn["content"] for turn in e.meta["turns"]])]
    texts += [calculator.calculate(expression) for expression in ("1/2", "2+", "(1", "", "é", "1" * 101)]
    texts += [tool.description for tool in calculator.TOOLS]
    texts += [guess_number.FORMAT_ERROR, "higher", "lower", "correct"]
    for text in texts:
        assert tokenizer.unk_token_id not in tokenizer(text, add_special_tokens=False)["input_ids"], text


def test_games_played_side_by_side_keep_their_own_hidden_numbers():
    """As a batch plays them: every game's environment made, then each reset, then one turn of each in turn (the
    sandbox the first reset starts must not take the games not yet reset for lost ones)."""
    examples = rows("examples.guess_number")[:6]
    with EnvironmentHost(guess_number, timeout=60, output_chars=1000) as host:
        games = [host.environment(key) for key in range(len(examples))]
        for game, example in zip(games, examples, strict=True):
            assert game.reset(example) is None
        moves = [[turn["content"] for turn in e.meta["turns"] if turn["role"] == "assistant"] for e in examples]
        replies = [[] for _ in examples]
        for turn in range(max(map(len, moves))):
            for key, game in enumerate(games):
                if turn < len(moves[key]):
                    replies[key].append(game.step(moves[key][turn]).observation)
    for example, said in zip(examples, replies, strict=True):
        assert said == [t["content"] for t in example.meta["turns"] if t["role"] == "user"] + ["correct"]
    assert all(game.tool_errors == 0 for game in games)


def test_the_shops_price_tool_reads_each_rows_hidden_prices_through_the_sandbox_episodes_use():
    examples = rows("examples.shop")
    a, b = next(
        (a, b)
        for a in examples
        for b in examples
        if a.meta["item"] == b.meta["item"] and a.meta["prices"][a.meta["item"]] != b.meta["prices"][b.meta["item"]]
    )
    call = calculator.tool_call("price", {"item": a.meta["item"]})
    with EnvironmentHost(shop, timeout=60, output_chars=1000) as host:
        answers = []
        for key, example in enumerate((a, b)):
            environment = host.environment(key)
            environment.reset(example)
            answers.append(environment.step(call).observation)
            assert environment.tool_errors == 0
        assert answers == [str(e.meta["prices"][e.meta["item"]]) for e in (a, b)]  # the same call, each row's price
        environment = host.environment(2)
        environment.reset(a)
        assert environment.step(calculator.tool_call("price", {"item": "car"})).observation.startswith(
            "error: no 'car'"
        )
        assert environment.tool_errors == 1  # the tool's own error observation counts as the host's do
        assert environment.step(calculator.tool_call("price", {"item": "pen", "example": "x"})).observation.startswith(
            "error: "
        )
        assert environment.tool_errors == 2  # the model may not pass the example: not a declared argument
