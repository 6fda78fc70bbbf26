"""A user's path through the commands: overrides that stick, part of a pipeline in one command, every key a stage
reads in its help, what the data stage read, and override values that YAML reads as another type."""

import json
import subprocess

import pytest
import yaml
from omegaconf import OmegaConf

from flows.cli import main
from tasks.kinds import stage_kinds
from tasks.params.load import load_params
from tests.conftest import ENV, make_project, warm


def _example_name(kind) -> str:
    return {"round": f"{kind.name}@1", "model": f"{kind.name}@sft"}.get(kind.target, kind.name)


def _row(i: int) -> dict:
    return {
        "task": "arithmetic",
        "prompt": f"{i}+1=",
        "answer": str(i + 1),
        "solution": f"<think>{i}+1</think><answer>{i + 1}</answer>",
    }


def test_a_stage_run_with_overrides_writes_them_into_params_yaml_and_says_so(project, capsys):
    assert main(["stage", "data", "task.name=arithmetic", "data.num_test=8"]) == 0
    captured = capsys.readouterr()
    assert "params.yaml updated with task.name=arithmetic data.num_test=8" in captured.err
    params = load_params()
    assert (params.task.name, params.data.num_test) == ("arithmetic", 8)
    rows = (project / "artifacts/data/test.jsonl").read_text().splitlines()
    assert len(rows) == 8 and all(json.loads(row)["task"] == "arithmetic" for row in rows)


def test_overrides_that_fail_validation_leave_params_yaml_and_outputs_untouched(project, capsys):
    before = (project / "params.yaml").read_bytes()
    assert main(["stage", "data", "task.name=arithmetic", "sft.lr=-1"]) == 2
    assert "sft.lr: must be > 0" in capsys.readouterr().err
    assert (project / "params.yaml").read_bytes() == before
    assert not (project / "artifacts").exists()


def test_an_overlay_file_sticks_like_overrides(project, capsys):
    (project / "overlay.args").write_text("# a recipe\ndata.num_train=40\n\ndata.num_test=4\n")
    assert main(["stage", "data", "@overlay.args"]) == 0
    assert (load_params().data.num_train, load_params().data.num_test) == (40, 4)


@pytest.mark.parametrize(
    ("override", "read_as"),
    [
        ("reward_model.verdict_token=Yes", "YAML reads 'Yes' as the boolean true"),
        ("reward_model.verdict_token=on", "YAML reads 'on' as the boolean true"),
        ("task.arithmetic.ops=-", "YAML reads '-' as a list, [null]"),
        ("task.arithmetic.ops=", "YAML reads '' as null (no value)"),
    ],
)
def test_an_override_yaml_reads_as_another_type_says_what_it_was_read_as_and_how_to_quote_it(
    project, capsys, override, read_as
):
    before = (project / "params.yaml").read_bytes()
    key, _, text = override.partition("=")
    assert main(["stage", "data", override]) == 2
    err = capsys.readouterr().err
    assert read_as in err and f"'{key}=\"{text}\"' in a shell" in err
    assert (project / "params.yaml").read_bytes() == before and not (project / "artifacts").exists()
    # the quoting it suggests is read as the text
    assert OmegaConf.select(OmegaConf.from_dotlist([f'{key}="{text}"']), key) == text


def test_device_cuda_without_a_visible_gpu_is_refused_naming_the_key(project, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["stage", "sft", "device=cuda"]) == 2
    assert "device: 'cuda', but no GPU is visible here" in capsys.readouterr().err
    assert not (project / "artifacts").exists()
    # on a Ray cluster the stages run on its workers, whose GPUs this machine does not see
    load_params(project / "params.yaml", ["device=cuda", "runner.ray_address=10.0.0.1:6379"])


@pytest.mark.parametrize("kind", list(stage_kinds().values()), ids=lambda kind: kind.name)
def test_stage_help_lists_every_key_dvc_yaml_records_for_the_stage(project, capsys, kind):
    from tests.conftest import REPO

    assert main(["stage", _example_name(kind), "--help"]) == 0
    listed = {line.split(" = ")[0].strip() for line in capsys.readouterr().out.splitlines() if " = " in line}
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][kind.name]
    declared = stage.get("do", stage)["params"]
    for key in declared:
        assert key in listed or any(item.startswith(f"{key}.") for item in listed), key


def test_sampling_stages_read_the_prompt_format_and_bound():
    for name in ("grpo", "eval", "rejection", "ppo", "distill"):
        keys = stage_kinds()[name].param_keys
        assert {"task.chat_template", "task.system_prompt", "sft.max_prompt_length"} <= set(keys), name


def test_the_data_stage_says_what_it_read(project, capsys):
    rows = [_row(i) for i in range(3)]
    (project / "data/mine.jsonl").write_text("\n".join(json.dumps(row) for row in [*rows, rows[0]]) + "\n")
    assert main(["stage", "data", "task.name=arithmetic", "data.train_file=data/mine.jsonl", "data.num_test=5"]) == 0
    captured = capsys.readouterr()
    line = next(line for line in captured.out.splitlines() if line.startswith("data: "))
    assert line == (
        "data: task arithmetic; train 4 rows (read from data/mine.jsonl, 1 repeated); "
        "test 5 rows (generated from the seed)"
    )
    assert captured.err.count("repeat an earlier one") == 1


def test_a_stage_refuses_a_bad_row_of_your_own_before_its_overrides_stick(project, capsys):
    before = (project / "params.yaml").read_bytes()
    (project / "data/mine.jsonl").write_text('{"task": "arithmetic", "prompt": "1+1="}\n')
    assert main(["stage", "data", "task.name=arithmetic", "data.train_file=data/mine.jsonl"]) == 2
    assert "data/mine.jsonl:1: missing key" in capsys.readouterr().err
    assert (project / "params.yaml").read_bytes() == before and not (project / "artifacts").exists()


def _alignflow(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["alignflow", *args], cwd=project, env=warm(), capture_output=True, text=True)


@pytest.mark.slow
def test_repro_of_a_stage_runs_it_and_its_upstream_with_overrides_that_stick(tmp_path):
    project = make_project(tmp_path)
    (project / "overlay.args").write_text("data.num_test=8\n")
    wrong = _alignflow(project, "repro", "eval@nothing")
    assert wrong.returncode == 2 and "neither a pipeline (sft, " in wrong.stderr and "eval@base" in wrong.stderr
    assert not (project / "artifacts").exists()

    done = _alignflow(project, "repro", "eval@base", "@overlay.args", "task.name=arithmetic")
    assert done.returncode == 0, done.stderr
    assert "params.yaml updated with data.num_test=8 task.name=arithmetic" in done.stderr
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert set(lock) == {"sources", "data", "base", "eval@base"}  # up to eval@base: sft is not trained
    assert lock["data"]["params"]["params.yaml"]["task.name"] == "arithmetic"
    assert load_params(project / "params.yaml").data.num_test == 8
    status = subprocess.run(["dvc", "status", "eval@base"], cwd=project, env=ENV, capture_output=True, text=True)
    assert "up to date" in status.stdout  # the outputs agree with params.yaml as it now is


@pytest.mark.slow
def test_a_repeated_row_is_said_once_with_the_project_relative_path(tmp_path):
    rows = [_row(i) for i in range(20)]
    project = make_project(tmp_path, ("task.name=arithmetic", "data.train_file=data/shards"))
    (project / "data/shards").mkdir(parents=True)
    (project / "data/shards/a.jsonl").write_text("\n".join(json.dumps(row) for row in [*rows, rows[0]]) + "\n")
    done = _alignflow(project, "repro", "data")
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    [warning] = [line for line in said.splitlines() if "repeat an earlier one" in line]
    assert str(project) not in warning
    assert "data/shards/a.jsonl:21 repeats data/shards/a.jsonl:1" in said


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task.system_prompt=Be brief."], "task.system_prompt: set, but the base model (the built-in tiny model) has"),
        (["task.system_prompt=Be brief.", "task.chat_template=never"], "task.system_prompt: set, but task.chat_temp"),
    ],
)
def test_a_system_prompt_with_no_template_to_put_it_in_is_refused(project, capsys, overrides, message):
    before = (project / "params.yaml").read_bytes()
    assert main(["stage", "sft", *overrides]) == 2  # a stage that puts prompts to the model checks their format
    assert message in capsys.readouterr().err
    assert (project / "params.yaml").read_bytes() == before and not (project / "artifacts").exists()


def _templated_tokenizer():
    from models import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    return tokenizer


def test_a_control_token_in_a_row_or_the_system_prompt_is_refused_not_parsed():
    from tasks.data.datasets import DatasetError, check_prompt_lengths
    from tasks.data.problems import Example
    from tasks.data.prompts import PromptFormat, PromptFormatError

    tokenizer = _templated_tokenizer()
    rows = [Example("arithmetic", "1+1=", "2", "<answer>2</answer>"), Example("arithmetic", "2+2=</s>", "4", "")]
    with pytest.raises(DatasetError, match=r"rows.jsonl:2: the prompt holds '</s>', a control token"):
        check_prompt_lengths(rows, tokenizer, PromptFormat("auto", None), "rows.jsonl", 32, 128, ("eval.k", 8))
    with pytest.raises(PromptFormatError, match=r"task.system_prompt holds '<s>'"):
        PromptFormat("auto", "Answer.<s>").encode(tokenizer, ["1+1="])


def test_a_prompt_over_the_bound_because_of_the_system_prompt_names_it():
    from tasks.data.datasets import DatasetError, check_prompt_lengths
    from tasks.data.problems import Example
    from tasks.data.prompts import PromptFormat

    tokenizer, rows = _templated_tokenizer(), [Example("arithmetic", "1+1=", "2", "")]
    fits = PromptFormat("auto", "Be brief.")
    check_prompt_lengths(rows, tokenizer, fits, "rows.jsonl", 16, 128, ("eval.max_new_tokens", 8))
    with pytest.raises(
        DatasetError,
        match=r"rows.jsonl:1: the prompt is 38 tokens, over sft.max_prompt_length=16 \(task.system_prompt is 32 tokens",
    ):
        check_prompt_lengths(
            rows, tokenizer, PromptFormat("auto", "x" * 32), "rows.jsonl", 16, 128, ("eval.max_new_tokens", 8)
        )


def test_characters_the_tiny_tokenizer_lacks_are_counted_and_warned_where_the_model_meets_the_data(project, capsys):
    rows = [_row(i) for i in range(4)]
    rows[1]["solution"] = rows[1]["solution"].replace("<think>", "<think>é")
    rows[2]["solution"] = rows[2]["solution"].replace("<think>", "<think>1×2 ")
    (project / "data/mine.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    overrides = [
        "task.name=arithmetic",
        "data.train_file=data/mine.jsonl",
        "data.num_test=5",
        "sft.max_steps=1",
        "sft.batch_size=4",
    ]
    for stage in ("data", "base", "sft"):
        assert main(["stage", stage, *overrides]) == 0
    err = capsys.readouterr().err
    said = "2 row(s) hold characters the model's tokenizer does not know ('é', '×'): each reads as"
    assert f"artifacts/data/train.jsonl: {said}" in err
