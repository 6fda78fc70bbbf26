"""A task of your own: a module named in params (task.name), its rows in its own fields, its verifier. The example
under examples/word_problems runs through the stages that prompt and verify; a module that cannot serve is refused
before any stage runs, naming task.name."""

import json
import shutil

import pytest
import yaml

from flows.cli import main
from tasks.data.datasets import read_shards
from tasks.data.problems import score_response, task_module
from tests.conftest import REPO, dvc, make_project

WORD_PROBLEMS = "task.name=examples.word_problems"
ROW = {"question": "Ana has 12 apples and gets 7 more. How many apples now?", "answer": 19, "steps": "12+7=19"}


@pytest.fixture
def word_problems(project):
    shutil.copytree(REPO / "examples", project / "examples")
    return project


def test_the_example_task_reads_its_own_fields_and_verifies_the_last_number(word_problems):
    (word_problems / "data/rows.jsonl").write_text(json.dumps(ROW) + "\n")
    (example,) = read_shards("data/rows.jsonl", "examples.word_problems")
    assert example.task == "examples.word_problems" and example.prompt == ROW["question"] and example.answer == "19"
    assert example.solution == "12+7=19. The answer is 19."
    assert score_response(example, "She has 12 + 7 = 19 apples.") == (True, True)
    assert score_response(example, "19 apples? No: 18.") == (True, False)
    assert score_response(example, "Many apples.") == (False, False)
    assert task_module("examples.word_problems").difficulty(example) == "addition"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({k: v for k, v in ROW.items() if k != "answer"}, "'answer' must be a number, got None"),
        ({**ROW, "answer": "nineteen"}, "'answer' must be a number, got 'nineteen'"),
        ({**ROW, "question": ""}, "'question' must be a non-empty string"),
        ({**ROW, "hint": "count"}, "unknown field(s) hint"),
        ({**ROW, "operation": "sorting"}, "'operation' must be one of"),
    ],
)
def test_rows_missing_the_tasks_fields_are_refused_naming_file_and_line(word_problems, capsys, row, message):
    (word_problems / "data/rows.jsonl").write_text(json.dumps(ROW) + "\n" + json.dumps(row) + "\n")
    assert (
        main(["stage", "data", WORD_PROBLEMS, "data.train_file=data/rows.jsonl", "data.test_file=data/rows.jsonl"]) == 2
    )
    assert f"data/rows.jsonl:2: {message}" in capsys.readouterr().err
    assert not (word_problems / "artifacts").exists()


def test_a_task_module_that_cannot_serve_is_refused_naming_the_key(project, capsys):
    (project / "broken_task.py").write_text("raise RuntimeError('half-written')\n")
    (project / "partial_task.py").write_text("def score(example, response):\n    return True, True\n")
    assert main(["stage", "data", "task.name=broken_task"]) == 2
    assert "task.name: the task module 'broken_task' does not import (RuntimeError: half-written)" in (
        capsys.readouterr().err
    )
    assert main(["stage", "data", "task.name=partial_task"]) == 2
    assert "task.name: the task module 'partial_task' lacks difficulty() (docs/tasks.md" in capsys.readouterr().err
    (project / "unverified_task.py").write_text("def difficulty(example):\n    return 'any'\n")
    assert main(["stage", "data", "task.name=unverified_task"]) == 2  # eval would have failed at its first row
    assert "task.name: the task module 'unverified_task' lacks score(), the verifier" in capsys.readouterr().err
    assert main(["stage", "data", WORD_PROBLEMS.replace("examples.", "no_such_package.")]) == 2
    assert "does not import (ModuleNotFoundError" in capsys.readouterr().err
    assert not (project / "artifacts").exists()


def test_a_task_without_generate_needs_rows_of_your_own(word_problems, capsys):
    assert main(["stage", "data", WORD_PROBLEMS]) == 2
    error = capsys.readouterr().err
    assert "data.train_file: the task 'examples.word_problems' generates no problems" in error
    assert "data.test_file:" in error


@pytest.mark.slow
def test_the_example_task_runs_through_sft_grpo_and_eval(tmp_path):
    """The word problems on the tiny model: sft_cold on its worked solutions, GRPO rewarded by its verifier, eval."""
    overrides = (
        WORD_PROBLEMS,
        "data.train_file=data/word_problems/train.jsonl",
        "data.test_file=data/word_problems/test.jsonl",
        "base.max_position_embeddings=160",  # the questions are up to 76 characters: tokens, to this model
        "student_base.max_position_embeddings=160",
        "reward_backbone.max_position_embeddings=160",
        "sft.max_prompt_length=80",
        "sft.max_length=128",
        "sft_cold.max_prompt_length=80",
        "sft_cold.max_length=128",
        "sft_cold.max_steps=20",
        "grpo.steps=2",
        "grpo.max_new_tokens=32",
        "eval.max_new_tokens=32",
    )
    project = make_project(tmp_path, overrides)
    (project / "data/word_problems").mkdir()
    shutil.copy(REPO / "examples/word_problems/train.jsonl", project / "data/word_problems/train.jsonl")
    test_rows = (REPO / "examples/word_problems/test.jsonl").read_text().splitlines(keepends=True)[:40]
    (project / "data/word_problems/test.jsonl").write_text("".join(test_rows))  # 40 held out: eval in seconds
    dvc(project, "repro", "eval@grpo")
    rows = [json.loads(line) for line in (project / "artifacts/data/test.jsonl").read_text().splitlines()]
    assert len(rows) == 40 and {row["task"] for row in rows} == {"examples.word_problems"}
    # the rollouts were rewarded by the task's verifier: responses that state a number are well formatted
    grpo = yaml.safe_load((project / "metrics/grpo/metrics.json").read_text())
    assert set(grpo["train"]["rewards"]) == {"accuracy", "format"} and grpo["train"]["rewards"]["format"] > 0
    greedy = [json.loads(line) for line in (project / "artifacts/eval/grpo/greedy.jsonl").read_text().splitlines()]
    by_prompt = {row["prompt"]: row for row in rows}
    examples = read_shards(project / "data/word_problems/test.jsonl", "examples.word_problems")
    for example in examples:  # eval's verdicts are the task's own
        row = greedy[[g["prompt"] for g in greedy].index(example.prompt)]
        assert (row["formatted"], row["correct"]) == score_response(example, row["response"])
    assert len(by_prompt) == len(greedy) == 40
