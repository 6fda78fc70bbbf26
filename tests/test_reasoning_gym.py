"""reasoning-gym's datasets as the built-in ``reasoning_gym`` task family: rows drawn from the seed, the dataset's
own ``score_answer`` as the verifier (its credit the accuracy reward), config errors refused before any stage."""

import json
from collections import Counter
from types import SimpleNamespace

import pytest

from flows.cli import main
from tasks.data.datasets import generate_splits, read_examples
from tasks.data.problems import Example, score_credit, score_response
from tasks.params.load import load_params
from tasks.rl.rewards import RewardInputs, accuracy, correct
from tests.conftest import REPO, produced

LEG_COUNTING = ["task.name=reasoning_gym", "data.num_train=40", "data.num_test=10"]


def test_the_same_seed_gives_byte_identical_rows_and_another_seed_others(project, tmp_path):
    assert main(["stage", "data", *LEG_COUNTING]) == 0
    first = (project / "artifacts/data/train.jsonl").read_bytes()
    rows = [json.loads(line) for line in first.splitlines()]
    assert {row["task"] for row in rows} == {"reasoning_gym"} and len(rows) == 40
    assert all(row["meta"]["dataset"] == "leg_counting" for row in rows)
    assert main(["stage", "data"]) == 0  # the overrides stuck: the same params again
    assert (project / "artifacts/data/train.jsonl").read_bytes() == first
    assert main(["stage", "data", "seed=7"]) == 0
    assert (project / "artifacts/data/train.jsonl").read_bytes() != first


def test_the_datasets_own_score_grades_and_correct_means_full_credit():
    params = load_params(REPO / "params.yaml", ["task.name=reasoning_gym"])
    train, _ = generate_splits(params.task, 8, 2, seed=0)
    example = train[0]
    assert score_credit(example, example.solution) == (True, 1.0)
    wrong = f"<think></think><answer>{int(example.answer) + 1}</answer>"
    assert score_credit(example, wrong) == (True, 0.0) and score_response(example, wrong) == (True, False)
    assert score_credit(example, example.answer) == (False, 0.0)  # out of the answer format
    batch = RewardInputs([example, example], [example.solution, wrong], [4, 4], [False, False], 16)
    assert accuracy(batch) == [1.0, 0.0]


def test_a_partial_credit_is_the_accuracy_reward_but_not_correct_nor_the_correct_reward():
    params = load_params(REPO / "params.yaml", ["task.name=reasoning_gym"])
    (example,), _ = generate_splits(params.task, 1, 1, seed=0)
    with_units = f"<think></think><answer>{example.answer} legs</answer>"  # leg_counting gives part credit
    formatted, credit = score_credit(example, with_units)
    assert formatted and 0.0 < credit < 1.0
    assert score_response(example, with_units) == (True, False)
    batch = RewardInputs([example, example], [with_units, example.solution], [4, 4], [False, False], 16)
    assert accuracy(batch) == [credit, 1.0]
    assert correct(batch) == [0.0, 1.0]


def test_an_answer_the_datasets_scorer_raises_on_scores_zero():
    factors = SimpleNamespace(
        name="reasoning_gym",
        reasoning_gym=SimpleNamespace(datasets={"prime_factorization": SimpleNamespace(weight=1.0, config={})}),
    )
    (example,), _ = generate_splits(factors, 1, 1, seed=0)
    assert score_credit(example, "<think></think><answer>x</answer>") == (True, 0.0)  # its scorer: int('x')
    assert score_credit(example, example.solution) == (True, 1.0)


def test_several_datasets_are_drawn_by_weight_and_grouped_by_name():
    weighted = {"leg_counting": {"weight": 3.0}, "basic_arithmetic": {"weight": 1.0}}
    overrides = ["task.name=reasoning_gym", f"task.reasoning_gym.datasets={json.dumps(weighted)}"]
    params = load_params(REPO / "params.yaml", overrides)
    train, _ = generate_splits(params.task, 400, 10, seed=0)
    drawn = Counter(example.meta["dataset"] for example in train)
    assert set(drawn) == {"leg_counting", "basic_arithmetic"}
    assert 2.2 < drawn["leg_counting"] / drawn["basic_arithmetic"] < 4.0  # 3:1, within the draw's noise
    assert all(score_response(example, example.solution) == (True, True) for example in train)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("task.reasoning_gym.datasets.leg_countin={}", "task.reasoning_gym.datasets.leg_countin: not a reasoning-gym"),
        ("task.reasoning_gym.datasets.leg_counting.config.legs=3", "config.legs: not a knob of leg_counting (choices:"),
        ("task.reasoning_gym.datasets.leg_counting.config.size=3", "config.size: the sizes are data.num_train"),
        ("task.reasoning_gym.datasets.leg_counting.config.min_animals=-3", "min_animals must be positive"),
        ("task.reasoning_gym.datasets.prime_factorization={}", "tokenizer lacks ('×'); run it on a model of your own"),
    ],
)
def test_a_config_error_is_refused_before_any_stage_naming_the_key(project, capsys, override, message):
    assert main(["stage", "data", "task.name=reasoning_gym", override]) == 2
    err = capsys.readouterr().err
    assert message in err
    if "not a reasoning-gym" in message:
        assert "choices: ab, acre," in err and "leg_counting" in err
    assert produced(project) == []


def test_a_row_that_is_not_the_item_its_meta_names_is_refused_naming_its_line(project, capsys):
    params = load_params(REPO / "params.yaml", ["task.name=reasoning_gym"])
    train, _ = generate_splits(params.task, 4, 2, seed=0)
    rows = [example.to_row() for example in train]
    rows[2]["answer"] = str(int(rows[2]["answer"]) + 1)
    (project / "data/rg.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"rg.jsonl:3: .*not leg_counting's item of seed"):
        read_examples(project / "data/rg.jsonl")
    assert read_examples_of(train, project) == train  # the untouched rows read back as they were written


def read_examples_of(examples: list[Example], project) -> list[Example]:
    (project / "data/good.jsonl").write_text("".join(json.dumps(e.to_row()) + "\n" for e in examples))
    return read_examples(project / "data/good.jsonl")
