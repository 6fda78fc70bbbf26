"""TextArena's single-player games as a built-in agent task (``task.name`` or ``agent_data.task``: ``textarena``).

``task.textarena.game`` names the game by its TextArena id (``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ...). A row
is one game, seeded with a number drawn from the data stage's seeded generator: its prompt is the game's opening
text (after ``Game <seed>:``, which keeps games with the same opening apart), its ``meta`` the game and the seed.
The world (``environment``) is that game: each model turn goes to TextArena's ``step`` as it is (a game reads its
move from the text, ``[42]``, ``[A C]``), and the next observation is what the game said since the last one (the
echo of the model's own move left out). The episode ends when the game does; the game's reward for the player is
the episode's ``env_reward``: 1 for a win, less for a loss or an invalid move (TextArena's rewards, per game).

``score`` grades the episode, not its last turn alone: a game is won by the whole episode, so ``correct`` (pass@1)
is a won game (the reward 1), and the credit the accuracy reward pays is the reward clipped to [0, 1]. A final
turn holding a bracketed move is well formatted. A game lost to invalid moves pays ``task.textarena.forfeit_reward``
(carried in each row's ``meta``), not the progress TextArena pays for it, which RL would learn to collect.

Worked traces: for a game with a solver here (``SOLVERS``: GuessTheNumber's binary search), each row's
``meta["turns"]`` is the solver's won game, played through TextArena itself and replayed at the data stage as every
trace is. A game without one gets rows without traces: RL from a base that already plays it (docs/agents.md).
"""

import functools
import re
from collections.abc import Callable
from typing import Any

from tasks.data.problems.example import Example
from tasks.data.step import Step

SEEDS = 2**31
PLAYER = 0
WIN = 1.0  # TextArena's reward for a won single-player game
_MOVE = re.compile(r"\[[^\[\]]+\]")
_OWN_MOVE = re.compile(r"^\[Player\]")  # TextArena echoes the move into the next observation: the model wrote it
# A trace longer than this is the solver's failure, not a game
_SOLVER_TURNS = 200


@functools.lru_cache(maxsize=1)
def registry() -> dict[str, Any]:
    """TextArena's game ids and their specs (a 1 s import: only for this family)."""
    from textarena.envs.registration import ENV_REGISTRY

    return ENV_REGISTRY


def _text(observation: Any) -> str:
    """An observation as text: the wrapped games give the history as one string, the ``-raw`` ones a list of
    (sender, message, kind) entries."""
    if isinstance(observation, str):
        return observation
    return "\n".join(
        str(entry[1]) if isinstance(entry, tuple | list) and len(entry) > 1 else str(entry) for entry in observation
    )


class Game:
    """One seeded TextArena game, as an ``Environment``: the opening text, then each turn's new text."""

    def __init__(self, game: str, seed: int, forfeit_reward: float | None = None):
        import textarena

        self.forfeit_reward = forfeit_reward
        self.env = textarena.make(env_id=game)
        self.env.reset(num_players=1, seed=seed)
        self.seen = ""
        self.opening = self._news()

    def _news(self) -> str:
        """What the game said to the player since the last call, without the echo of the player's own move."""
        _, observation = self.env.get_observation()
        text = _text(observation)
        news = text[len(self.seen) :] if text.startswith(self.seen) else text
        self.seen = text
        return "\n".join(line for line in news.strip().splitlines() if not _OWN_MOVE.match(line)).strip()

    def reset(self, example: Example) -> str | None:
        return None  # the prompt holds the opening

    def step(self, action: str) -> Step:
        done, _ = self.env.step(action=action)
        if not done:
            return Step(self._news(), 0.0, False)
        rewards, info = self.env.close()
        player = (info or {}).get(PLAYER, {})
        reward = float(rewards[PLAYER])
        if player.get("invalid_move") and self.forfeit_reward is not None:
            reward = self.forfeit_reward
        return Step(str(player.get("reason", "the game is over")), reward, True)


def environment(example: Example) -> Game:
    return Game(example.meta["game"], int(example.meta["seed"]), example.meta["forfeit_reward"])


def prompt(seed: int, opening: str) -> str:
    return f"Game {seed}:\n{opening}"


@functools.lru_cache(maxsize=4096)
def opening_prompt(game: str, seed: int) -> str:
    """The prompt of ``game``'s game of ``seed``: every stage reads (and checks) its rows, so each game is made once."""
    return prompt(seed, Game(game, seed).opening)


def guess_the_number(game: Game) -> str:
    """GuessTheNumber's solver: binary search over the range the game states, narrowed by the hints it gave."""
    low, high = game.env.min_number, game.env.max_number
    for guess, hint in game.env.state.game_state["guess_history"]:
        low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
    return f"[{(low + high) // 2}]"


# game id prefix -> the next move of a winning player, given the game so far
SOLVERS: dict[str, Callable[[Game], str]] = {"GuessTheNumber-v0": guess_the_number}


def solver(game: str) -> Callable[[Game], str] | None:
    return next((play for prefix, play in SOLVERS.items() if game.startswith(prefix)), None)


def generate(rng, cfg: Any) -> Example:
    """One game of ``cfg.game`` (``task.textarena``), with the solver's won game as its trace where there is one."""
    seed = rng.randrange(SEEDS)
    game = Game(cfg.game, seed, cfg.forfeit_reward)
    meta: dict[str, Any] = {"game": cfg.game, "seed": seed, "forfeit_reward": cfg.forfeit_reward}
    solution = ""
    if (play := solver(cfg.game)) is not None:
        turns = []
        for _ in range(_SOLVER_TURNS):
            move = play(game)
            turns.append({"role": "assistant", "content": move})
            step = game.step(move)
            if step.done:
                if step.reward != WIN:
                    raise RuntimeError(f"the {cfg.game} solver lost game {seed}: {step.observation}")
                break
            turns.append({"role": "user", "content": step.observation})
        meta["turns"], solution = turns, turns[-1]["content"]
    return Example("textarena", prompt(seed, game.opening), "won", solution, meta)


def score(example: Example, response: str, env_reward: float | None = None) -> tuple[bool, float]:
    """(the final turn holds a bracketed move, the game's reward clipped to [0, 1]: 1 is a won game). Without the
    episode (``env_reward`` None: a response graded alone, the worked trace's last move) the move is judged by
    replaying the row's trace."""
    if env_reward is None:
        won = bool(example.meta.get("turns")) and response == example.solution
        return bool(_MOVE.search(response)), float(won)
    return bool(_MOVE.search(response)), min(max(env_reward, 0.0), 1.0)


def difficulty(example: Example) -> str:
    return example.meta["game"]


def mismatch(example: Example) -> str | None:
    """Why a row is not the game its meta names (its prompt is that seed's opening)."""
    if not {"game", "seed", "forfeit_reward"} <= set(example.meta):
        return "a textarena row's meta must hold its game, seed and forfeit_reward"
    if example.prompt != opening_prompt(example.meta["game"], int(example.meta["seed"])):
        return f"the prompt is not the opening of {example.meta['game']}'s game of seed {example.meta['seed']}"
    return None


def offline_games() -> dict[str, str]:
    """Each TextArena game id (its variants without ``-raw``/``-train``) and whether it plays here single-player and
    offline: "plays", or why not, in one line."""
    verdicts = {}
    for game in sorted(registry()):
        if game.endswith(("-raw", "-train")):
            continue
        try:
            Game(game, 0)
            verdicts[game] = "plays"
        except Exception as error:  # a game that needs two players or a download says so in its own words
            lines = [line.strip() for line in str(error).splitlines() if line.strip().strip("*")]
            verdicts[game] = f"{type(error).__name__}: {lines[0][:100] if lines else ''}"
    return verdicts


if __name__ == "__main__":  # python -m tasks.data.problems.textarena_family: the games that play here (docs/agents.md)
    for game, verdict in offline_games().items():
        print(f"{game}\t{verdict}")
