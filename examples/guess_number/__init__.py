"""An interactive task with hidden state: guess a number from 1 to 100 (``task.name: examples.guess_number``).

The hidden number is in the row's ``meta["number"]``, never in its prompt. Each model turn is one guess in the
project's response format, ``<think>...</think><answer>N</answer>``; the environment replies ``higher``, ``lower`` or
``correct`` (the game ends; the reward is ``win_reward``: 1.0 on the first guess, 1/7 on the seventh), and a turn it
cannot read as a guess gets ``format error``. A game allows ``MAX_GUESSES`` turns, enough for binary search over
1..100. The worked trace in ``meta["turns"]`` is a won game, with the interval still open in each think, e.g. binary
search for 63::

    assistant: <think>1-100</think><answer>50</answer>
    user:      higher
    assistant: <think>51-100</think><answer>75</answer>
    user:      lower
    ...
    assistant: <think>63-64</think><answer>63</answer>

and ``solution`` is the last, winning guess. The traces are two players' won games: most open with a wasted guess
(see ``opening_search``), so the strategy SFT clones is not the best one there is, and RL has one to find. README.md
beside this file says more.
"""

import random
import re

from tasks.data.environments import Step
from tasks.data.problems.example import Example, parse_response

LOW, HIGH = 1, 100
# Binary search needs (HIGH - LOW + 1).bit_length() guesses at worst: 7 for 1..100.
MAX_GUESSES = 7
# The share of the logged games the opening player (``opening_search``) played.
OPENING_SHARE = 0.9
FORMAT_ERROR = "format error"
_INTEGER = re.compile(r"-?\d+")
# The game number keeps prompts distinct (the data stage draws distinct prompts); it is drawn apart from the hidden
# number, so it says nothing about it.
_GAMES = 100_000


def binary_search_turns(number: int, low: int = LOW, high: int = HIGH) -> int:
    """How many guesses binary search (the middle of the interval still open, rounded down) takes to hit ``number``."""
    return len(binary_search(number, low, high))


def worst_case_turns(low: int = LOW, high: int = HIGH) -> int:
    """The most guesses binary search takes over ``low..high``: 7 for 1..100."""
    return (high - low + 1).bit_length()


def binary_search(number: int, low: int = LOW, high: int = HIGH) -> list[tuple[int, int, int]]:
    """(low, high, guess) of each turn of binary search for ``number``, the last guess being ``number``."""
    if not low <= number <= high:
        raise ValueError(f"{number} is not in {low}..{high}")
    turns = []
    while True:
        guess = (low + high) // 2
        turns.append((low, high, guess))
        if guess == number:
            return turns
        low, high = (guess + 1, high) if number > guess else (low, guess - 1)


def opening_search(number: int) -> list[tuple[int, int, int]]:
    """(low, high, guess) of each turn of the other player: it first guesses ``LOW`` and then searches the rest by
    halves. The wasted guess costs it a turn, and the game on the 36 numbers halving 2..100 needs 7 guesses for."""
    if number == LOW:
        return [(LOW, HIGH, LOW)]
    return [(LOW, HIGH, LOW), *binary_search(number, LOW + 1, HIGH)]


def logged_search(number: int, player: float) -> list[tuple[int, int, int]]:
    """The worked trace's turns for ``number``, ``player`` a draw in [0, 1) of who played it: the opening player
    (``OPENING_SHARE`` of the games) where it wins within ``MAX_GUESSES``, else binary search (only won games are
    logged). The opening player wins 64 numbers of 100: about 58 traces in 100 open with the wasted guess, so a
    cloned policy opens with it (greedily, always) and wins at most 64 games in 100, in more turns than binary
    search; binary search's traces, on every number, teach the better opening's whole game."""
    opening = opening_search(number)
    return opening if player < OPENING_SHARE and len(opening) <= MAX_GUESSES else binary_search(number)


def guess_turn(low: int, high: int, guess: int) -> str:
    """A model turn of the worked strategy: the interval still open, then the guess."""
    return f"<think>{low}-{high}</think><answer>{guess}</answer>"


def read_guess(turn: str) -> int | None:
    """The guess a model turn makes, or None when the turn is not ``<think>...</think><answer>N</answer>``."""
    parsed = parse_response(turn)
    if parsed is None or _INTEGER.fullmatch(parsed.answer) is None:
        return None
    return int(parsed.answer)


def win_reward(turns: int) -> float:
    """The world's reward for a win on guess ``turns``: 1.0 on the first, 1/7 on the seventh. Winning is what counts
    (the verifier scores it); the world's share says that a game won in fewer guesses is played better."""
    return (MAX_GUESSES - turns + 1) / MAX_GUESSES


def reply(number: int, guess: int) -> str:
    return "correct" if guess == number else "higher" if number > guess else "lower"


class GuessNumber:
    """One game: the hidden number, the guesses made and how many turns could not be read."""

    def __init__(self, example: Example):
        self.reset(example)

    def reset(self, example: Example) -> str | None:
        """A new game for ``example``; the prompt opens it, so there is no opening observation."""
        self.number = int(example.meta["number"])
        self.turns = 0
        self.format_errors = 0
        return None

    def step(self, action: str) -> Step:
        """The reply to one model turn; the game ends on the right guess or after ``MAX_GUESSES`` turns."""
        self.turns += 1
        guess = read_guess(action)
        if guess is None:
            self.format_errors += 1
            observation = FORMAT_ERROR
        else:
            observation = reply(self.number, guess)
        won = guess == self.number
        return Step(observation, reward=win_reward(self.turns) if won else 0.0, done=won or self.turns >= MAX_GUESSES)


def environment(example: Example) -> GuessNumber:
    return GuessNumber(example)


def generate(rng: random.Random, cfg: object) -> Example:
    """One game with its logged trace (``logged_search``); ``cfg`` is unused (a task module of your own has no
    ``task.<name>`` section of settings)."""
    game, number, player = rng.randrange(_GAMES), rng.randint(LOW, HIGH), rng.random()
    turns = []
    for low, high, guess in logged_search(number, player):
        turns.append({"role": "assistant", "content": guess_turn(low, high, guess)})
        if guess != number:
            turns.append({"role": "user", "content": reply(number, guess)})
    prompt = f"Game {game:05d}: guess {LOW} to {HIGH}"
    return Example(__name__, prompt, str(number), turns[-1]["content"], {"number": number, "turns": turns})


def score(example: Example, response: str) -> tuple[bool, bool]:
    """(the final turn is a guess in format, it is the hidden number)."""
    guess = read_guess(response)
    return guess is not None, guess == int(example.meta["number"])


def difficulty(example: Example) -> str:
    """How many guesses binary search needs for the hidden number: 1 to 7."""
    return f"{binary_search_turns(int(example.meta['number']))}-turn"
