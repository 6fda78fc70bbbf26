"""A task of your own: a module named in params (task.name), its rows in its own fields, its verifier. The example
under examples/word_problems runs through the stages that prompt and verify; a module that cannot serve is refused
before any stage runs, naming task.name."""

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml
from omegaconf import OmegaConf

from flows.cli import main
from tasks.data.datasets import generate_splits, read_shards
from tasks.data.judge import gold_utility
from tasks.data.problems import Example, TaskError, score_response, task_module
from tasks.rl.rewards import RewardInputs, accuracy, format_reward
from tasks.rollout.engine import Completion, Sampling
from tasks.stages.eval import greedy_responses
from tasks.stages.rejection_sampling import accepted
from tests.conftest import REPO, TINY, dvc, make_project

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


# A task of its own built on the word problems: its from_row reads their rows as its own (tagged with its name).
OWN_ROWS = """import dataclasses

import examples.word_problems
from examples.word_problems import difficulty, score

def from_row(row):
    return dataclasses.replace(examples.word_problems.from_row(row), task=__name__)
"""


def _task_of_its_own(project, name: str, functions: str, header: str = OWN_ROWS) -> str:
    """A task module ``name`` in the project: ``header``'s functions, ``functions`` replacing some of them."""
    (project / f"{name}.py").write_text(f"{header}\n\n{functions}")
    return name


def _verdict_on_model_text(project, name: str, verdict: str) -> str:
    """A task whose verifier accepts its worked solutions and says ``verdict`` of any other response."""
    score = f"def score(example, response):\n    return (True, True) if response == example.solution else ({verdict})\n"
    return _task_of_its_own(project, name, score)


def _rows(project, *rows: dict) -> str:
    (project / "data/rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return "data/rows.jsonl"


def _stage_data(project, name: str, *rows: dict) -> int:
    """The data stage of task ``name`` on ``rows`` for training and a good row of its own held out."""
    (project / "data/test.jsonl").write_text(json.dumps({"question": "Bo has 2 pens and gets 3.", "answer": 5}) + "\n")
    train = _rows(project, *rows)
    return main(["stage", "data", f"task.name={name}", f"data.train_file={train}", "data.test_file=data/test.jsonl"])


class _Says:
    """A rollout engine whose every completion is ``text``."""

    def __init__(self, text: str):
        self.text = text

    def generate(self, prompts: list[str], sampling: Sampling) -> list[Completion]:
        return [Completion(i, [], [1], self.text, [0.0]) for i in range(len(prompts)) for _ in range(sampling.n)]


NOT_A_PAIR = "not the pair (well_formatted, correct) of bools (or a credit in [0, 1] for correct)"


@pytest.mark.parametrize(
    ("verdict", "what"),
    [
        ("True, float('nan')", f"returned (True, nan) (tuple), {NOT_A_PAIR}"),
        ("True, 2.0", f"returned (True, 2.0) (tuple), {NOT_A_PAIR}"),
        ("'yes', True", f"returned ('yes', True) (tuple), {NOT_A_PAIR}"),
        ("True", f"returned True (bool), {NOT_A_PAIR}"),
        ("True, 1 / example.meta['steps']", "raised KeyError: 'steps'"),
    ],
    ids=["nan", "two", "string", "bool", "raises"],
)
def test_every_grader_refuses_a_verdict_that_is_not_a_pair_naming_the_task_and_example(
    word_problems, request, verdict, what
):
    """eval wrote pass@1=nan or 2.000 with exit 0, the RL rewards trained on them, a string said "too many
    dimensions 'str'": every stage grades through score_response, which names the task, score() and the example."""
    name = _verdict_on_model_text(word_problems, f"odd_{request.node.callspec.id}", verdict)
    (example,) = read_shards(_rows(word_problems, ROW), name)  # its worked solution passes
    response = "She has 12 + 7 = 19 apples."
    batch = RewardInputs([example], [response], [8], [False], 16)
    graders = {
        "eval": lambda: greedy_responses(_Says(response), [example], 16),
        "accuracy": lambda: accuracy(batch),
        "format": lambda: format_reward(batch),
        "gold judge": lambda: gold_utility(example, response),
        "rejection sampling": lambda: accepted(example, [response], 1),
    }
    for grader, grade in graders.items():
        with pytest.raises(TaskError) as raised:
            grade()
        assert f"{name}.score() {what}, on the response {response!r} to the prompt {ROW['question']!r}" in str(
            raised.value
        ), grader


def test_truth_values_of_any_kind_are_a_verdict_of_two_bools(word_problems):
    _task_of_its_own(
        word_problems,
        "numeric_verdict",
        "import numpy\n\ndef score(example, response):\n    return [numpy.True_, 0.0]\n",
    )
    example = Example("numeric_verdict", ROW["question"], "19", "12+7=19", {"operation": "addition"})
    assert score_response(example, "18") == (True, False)


@pytest.mark.parametrize(
    ("functions", "message"),
    [
        ("def score(example, response):\n    return True\n", "bool_task.score() returned True (bool), not the pair"),
        (
            "def difficulty(example):\n    return 3\n",
            "label_task.difficulty() returned 3 (int), not a non-empty string",
        ),
    ],
    ids=["bool_task", "label_task"],
)
def test_a_task_function_that_returns_the_wrong_kind_is_named_at_the_data_stage(
    word_problems, capsys, request, functions, message
):
    """A score returning a bool was blamed on the row: "'meta' lacks what the verifier needs"; a difficulty returning
    a number was written, to fail as a metric's name in rejection sampling."""
    name = _task_of_its_own(word_problems, request.node.callspec.id, functions)
    assert _stage_data(word_problems, name, ROW) == 2
    error = capsys.readouterr().err
    assert f"data/rows.jsonl:1: {message}" in error and "'meta' lacks" not in error
    assert not (word_problems / "artifacts").exists()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"answer": 19}, "keyed_task.from_row() raised KeyError: 'question'"),
        ({"question": "How many?", "answer": "19"}, "keyed_task.from_row() raised TypeError: can only concatenate str"),
    ],
)
def test_a_from_row_that_raises_on_a_bad_row_names_its_file_and_line(word_problems, capsys, row, message):
    """A from_row raising KeyError or TypeError on a row of the wrong shape was a traceback, naming no row."""
    _task_of_its_own(
        word_problems,
        "keyed_task",
        "from tasks.data.problems import Example\n\n"
        "def from_row(row):\n"
        "    answer = str(row['answer'] + 0)\n"
        "    return Example(__name__, row['question'], answer, f'The answer is {answer}.', {'operation': 'sum'})\n",
    )
    assert _stage_data(word_problems, "keyed_task", ROW | {"steps": ""}, row) == 2
    error = capsys.readouterr().err
    assert f"data/rows.jsonl:2: {message}" in error and "Traceback" not in error
    assert not (word_problems / "artifacts").exists()


def test_rows_are_the_declared_tasks_whichever_module_built_them(word_problems, capsys):
    """A module re-exporting the word problems' from_row (or a family's generate) tagged its rows with that task,
    whose verifier then graded them in place of its own."""
    reexported = "from examples.word_problems import difficulty, from_row\n"
    _task_of_its_own(
        word_problems, "own_verdicts", "def score(example, response):\n    return True, False\n", reexported
    )
    assert _stage_data(word_problems, "own_verdicts", ROW) == 2  # its verifier, not the word problems', judges
    assert "data/rows.jsonl:1: 'solution' does not pass the task's verifier" in capsys.readouterr().err
    assert not (word_problems / "artifacts").exists()
    (word_problems / "drawn_task.py").write_text("from tasks.data.problems.arithmetic import *  # noqa: F403\n")
    _task_of_its_own(word_problems, "read_task", "from examples.word_problems import score\n", reexported)
    assert {e.task for e in read_shards(_rows(word_problems, ROW), "read_task")} == {"read_task"}
    family = SimpleNamespace(name="drawn_task", drawn_task=SimpleNamespace(digits=2, ops=["+"]))
    train, test = generate_splits(family, 4, 2, seed=0)
    assert {e.task for e in train + test} == {"drawn_task"}


def test_eval_of_a_verifier_that_says_nan_stops_naming_it_and_writes_nothing(word_problems, capsys):
    """eval wrote pass@1=nan and exited 0."""
    _verdict_on_model_text(word_problems, "nan_task", "True, float('nan')")
    train, test = ({"question": f"{a}+{b}?", "answer": a + b, "steps": f"{a}+{b}={a + b}"} for a, b in ((2, 3), (4, 1)))
    (word_problems / "data/train.jsonl").write_text(json.dumps(train) + "\n")
    (word_problems / "data/test.jsonl").write_text(json.dumps(test) + "\n")
    params = OmegaConf.merge(
        OmegaConf.load("params.yaml"),
        OmegaConf.from_dotlist(
            [*TINY, "task.name=nan_task", "data.train_file=data/train.jsonl", "data.test_file=data/test.jsonl"]
        ),
    )
    OmegaConf.save(params, "params.yaml")
    assert main(["stage", "data"]) == 0 and main(["stage", "base"]) == 0
    capsys.readouterr()
    assert main(["stage", "eval@base"]) == 2
    assert "nan_task.score() returned (True, nan) (tuple), not the pair" in capsys.readouterr().err
    assert not (word_problems / "artifacts/eval").exists() and not (word_problems / "metrics/eval").exists()


def test_a_package_of_your_own_named_like_alignflows_examples_is_yours(tmp_path):
    """alignflow ships an ``examples`` package; an install puts it on the path before the project directory, as
    PYTHONPATH does here. A task module of your own under your own ``examples/`` must still be the one imported."""
    project = tmp_path / "project"
    (project / "examples").mkdir(parents=True)
    (project / "examples/__init__.py").write_text("")
    (project / "examples/mine.py").write_text("def difficulty(example):\n    return 'all'\n")
    probe = tmp_path / "bin/probe.py"  # a script elsewhere, as the console script is: not the project on sys.path
    probe.parent.mkdir()
    probe.write_text("from tasks.data.problems import task_module\nprint(task_module('examples.mine').__file__)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    found = subprocess.run([sys.executable, probe], cwd=project, env=env, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(project / "examples/mine.py")
