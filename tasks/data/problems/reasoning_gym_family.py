"""reasoning-gym's generated datasets as a built-in task family (``task.name: reasoning_gym``).

``task.reasoning_gym.datasets`` names one dataset or several, each with its weight and its own config (the
dataset's difficulty knobs, as ``reasoning_gym.create_dataset`` takes them). A problem is the dataset's item at an
index drawn from the data stage's seeded generator, so the same seed gives the same rows; the row keeps the dataset,
its config and the index (``meta``), from which the verifier rebuilds the item. The model answers in the
``<think>…</think><answer>…</answer>`` format; the answer tags' content goes to the dataset's own ``score_answer``,
whose score in [0, 1] is the accuracy reward, and correct (pass@1) means a score of 1. A response out of format
scores 0, and so does an answer the dataset's scorer raises on. The worked solution is the bare format around the
reference answer (``<think></think><answer>…``): reasoning-gym gives no worked reasoning, so SFT on it teaches the
format, and RL the rest.
"""

import functools
import json
import random
from typing import Any

from tasks.data.problems.example import Example, format_solution, parse_response

# Items are drawn by index: a dataset's item i is generated from its seed plus i.
INDICES = 2**20


@functools.cache
def dataset(name: str, config_json: str) -> Any:
    """The reasoning-gym dataset ``name`` with the config ``config_json`` (JSON, keys sorted)."""
    import reasoning_gym  # a 3 s import (sympy): only for this family

    return reasoning_gym.create_dataset(name, size=INDICES, seed=0, **json.loads(config_json))


def config_json(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def generate(rng: random.Random, cfg: Any) -> Example:
    """One problem of a dataset drawn by weight from ``cfg.datasets`` (``task.reasoning_gym``)."""
    names = sorted(cfg.datasets)
    name = rng.choices(names, [cfg.datasets[n].weight for n in names])[0]
    config, index = dict(cfg.datasets[name].config), rng.randrange(INDICES)
    item = dataset(name, config_json(config))[index]
    answer = str(item["answer"])
    meta = {"dataset": name, "config": config, "index": index}
    return Example("reasoning_gym", item["question"], answer, format_solution([], answer), meta)


def _item(example: Example) -> tuple[Any, dict]:
    meta = example.meta
    source = dataset(meta["dataset"], config_json(meta["config"]))
    return source, source[meta["index"]]


def score(example: Example, response: str) -> tuple[bool, float]:
    """(well_formatted, the dataset's score of the answer in [0, 1])."""
    parsed = parse_response(response)
    if parsed is None:
        return False, 0.0
    source, item = _item(example)
    try:
        return True, float(source.score_answer(answer=parsed.answer, entry=item))
    except Exception:  # some datasets' scorers raise on an answer they cannot parse (prime_factorization's 'x'): 0
        return True, 0.0


def difficulty(example: Example) -> str:
    return example.meta["dataset"]


def mismatch(example: Example) -> str | None:
    """Why a row is not the item its meta names: rows are rebuilt from (dataset, config, index) to be scored."""
    if not {"dataset", "config", "index"} <= set(example.meta):
        return "a reasoning_gym row's meta must hold its dataset, config and index"
    _, item = _item(example)
    if item["question"] != example.prompt or str(item["answer"]) != example.answer:
        return f"the prompt and answer are not {example.meta['dataset']}'s item {example.meta['index']}"
    return None
