"""reasoning-gym's generated datasets as a built-in task family (``task.name: reasoning_gym``).

``task.reasoning_gym.datasets`` names one dataset or several, each with its weight and its own config (the
dataset's difficulty knobs, as ``reasoning_gym.create_dataset`` takes them). A problem is the one item of the
dataset seeded with a number drawn from the data stage's seeded generator, so the same seed gives the same rows; the
row keeps the dataset, its config and that seed (``meta``), from which the verifier rebuilds the item. The model
answers in the ``<think>…</think><answer>…</answer>`` format; the answer tags' content goes to the dataset's own
``score_answer``, whose score in [0, 1] is the accuracy reward, and correct (pass@1) means a score of 1. A response
out of format scores 0, and so does an answer the dataset's scorer raises on. The worked solution is the bare format
around the reference answer (``<think></think><answer>…``): reasoning-gym gives no worked reasoning, so SFT on it
teaches the format, and RL the rest.
"""

import functools
import json
import random
from typing import Any

from tasks.data.problems.example import Example, format_solution, parse_response

SEEDS = 2**31  # each problem is the one item of a dataset seeded with a number drawn from the data stage's seed


@functools.lru_cache(maxsize=4096)
def item(name: str, config_json: str, seed: int) -> tuple[Any, dict]:
    """(the reasoning-gym dataset ``name`` of one item, seeded ``seed``, with the config ``config_json``, its item):
    one item a dataset, as some build all their items when made (acre)."""
    import reasoning_gym  # a 3 s import (sympy): only for this family

    source = reasoning_gym.create_dataset(name, size=1, seed=seed, **json.loads(config_json))
    return source, source[0]


def config_json(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def generate(rng: random.Random, cfg: Any) -> Example:
    """One problem of a dataset drawn by weight from ``cfg.datasets`` (``task.reasoning_gym``)."""
    names = sorted(cfg.datasets)
    name = rng.choices(names, [cfg.datasets[n].weight for n in names])[0]
    config, seed = dict(cfg.datasets[name].config), rng.randrange(SEEDS)
    _, problem = item(name, config_json(config), seed)
    answer = str(problem["answer"])
    meta = {"dataset": name, "config": config, "seed": seed}
    return Example("reasoning_gym", problem["question"], answer, format_solution([], answer), meta)


def _item(example: Example) -> tuple[Any, dict]:
    meta = example.meta
    return item(meta["dataset"], config_json(meta["config"]), meta["seed"])


def score(example: Example, response: str) -> tuple[bool, float]:
    """(well_formatted, the dataset's score of the answer in [0, 1])."""
    parsed = parse_response(response)
    if parsed is None:
        return False, 0.0
    source, problem = _item(example)
    try:
        return True, float(source.score_answer(answer=parsed.answer, entry=problem))
    except Exception:  # some datasets' scorers raise on an answer they cannot parse (prime_factorization's 'x'): 0
        return True, 0.0


def difficulty(example: Example) -> str:
    return example.meta["dataset"]


def mismatch(example: Example) -> str | None:
    """Why a row is not the item its meta names: rows are rebuilt from (dataset, config, index) to be scored."""
    if not {"dataset", "config", "seed"} <= set(example.meta):
        return "a reasoning_gym row's meta must hold its dataset, config and seed"
    _, problem = _item(example)
    if problem["question"] != example.prompt or str(problem["answer"]) != example.answer:
        return f"the prompt and answer are not {example.meta['dataset']}'s item of seed {example.meta['seed']}"
    return None
