"""The run form: per pipeline, the params its stages read as plain fields at their current values; a submission
becomes overrides of what changed only, validated like the CLI's and written into params.yaml."""

import json
from typing import Any

import pydantic
import pytest

from flows.overrides import changed_overrides, form_model, form_values
from flows.pipelines import RunCancelled, overrides_written
from tasks.common.config import ConfigError, Params
from tasks.common.config.fields import schema_fields
from tasks.common.registry import param_value
from tasks.params.load import fields_with_keys, load_params
from tasks.params.write import write_overrides
from tasks.pipelines import PIPELINES
from tests.conftest import REPO

PARAMS = load_params(REPO / "params.yaml")


@pytest.fixture(scope="module")
def forms() -> dict[str, type[pydantic.BaseModel]]:
    return {name: form_model(name, PARAMS, REPO) for name in PIPELINES}


def _schema_nodes(node: Any):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _schema_nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schema_nodes(value)


def _leaf_fields(schema: dict, properties: dict | None = None):
    """(title, field schema) of every input of the form, groups followed through their definitions."""
    for field in (schema["properties"] if properties is None else properties).values():
        if "$ref" in field:
            yield from _leaf_fields(schema, schema["$defs"][field["$ref"].split("/")[-1]]["properties"])
        else:
            yield field["title"], field


def _submitted(form: type[pydantic.BaseModel], **changes: Any) -> pydantic.BaseModel:
    """What the UI sends for ``form`` left at its defaults but for ``changes`` (dotted key -> value), as the flow
    receives it: JSON, nulls left out."""
    values = json.loads(form().model_dump_json())
    for key, value in changes.items():
        *groups, name = key.split(".")
        node = values
        for group in groups:
            node = node[group]
        node[name] = value
    return form.model_validate(values)


def test_the_sft_form_holds_what_its_stages_read_as_plain_described_fields_at_their_params_yaml_values(forms):
    schema = forms["sft"].model_json_schema()
    # dvc.yaml's data, base, sft and eval stages read these (eval plays an agent task's episodes within agent.*)
    assert list(schema["properties"]) == ["seed", "device", "decoding", "task", "data", "base", "sft", "eval", "agent"]
    for node in _schema_nodes(schema):
        assert not {"anyOf", "oneOf", "allOf"} & set(node), node  # Prefect's form shows a union as a toggle
        assert node.get("type") != "null" and not isinstance(node.get("type"), list), node
    leaves = dict(_leaf_fields(schema))
    read = {"seed", "device", "decoding", "task", "data", "base", "sft", "eval", "agent"}
    placement = {"runner", "roles", "parallel"}  # the deployment's business, not a run's
    # reasoning-gym's datasets are a mapping of sections you name, edited in params.yaml as the rounds are
    placement |= {"reasoning_gym"}
    expected = {key for key, _, _ in fields_with_keys(PARAMS) if key.split(".")[0] in read}
    assert set(leaves) == {key for key in expected if not placement & set(key.split("."))}
    for key, field in leaves.items():
        assert field["description"], f"{key} has no description"
        # a null param is an empty field; a tuple is a JSON list
        assert field.get("default") == json.loads(json.dumps(param_value(PARAMS, key))), key
    assert leaves["sft.lr"] | {"default": None} == {
        "default": None,
        "description": "Peak AdamW learning rate.",
        "exclusiveMinimum": 0,
        "title": "sft.lr",
        "type": "number",
    }
    assert (leaves["data.num_train"]["minimum"], leaves["data.num_train"]["maximum"]) == (1, 1_000_000)
    assert leaves["task.chat_template"]["enum"] == ["auto", "always", "never"]
    assert "pattern" in leaves["task.name"]  # a module path: the built-in families' names or your own module's
    assert leaves["base.model_path"]["type"] == "string" and "default" not in leaves["base.model_path"]
    # What the form fills itself with and sends: every value but the nulls (a null string field would be refused).
    assert schema["properties"]["sft"]["default"]["lr"] == PARAMS.sft.lr
    assert "model_path" not in schema["properties"]["base"]["default"]


def test_a_group_is_titled_with_its_key_and_its_sections_help(forms):
    properties = forms["sft"].model_json_schema()["properties"]
    assert properties["sft"]["title"] == "sft — Supervised fine-tuning on worked solutions"
    helps = {name: info.description for name, info in schema_fields(Params).items()}
    for name in ("task", "data", "base", "eval"):
        assert properties[name]["title"] == f"{name} — {helps[name].rstrip('.')}"


@pytest.mark.parametrize(
    ("pipeline", "holds", "lacks"),
    [
        ("sft", {"sft", "eval"}, {"ppo", "grpo", "sft_cold", "rejection", "dpo", "distill", "reward_model"}),
        # (reward_model reads dpo's and online_dpo's β, loss and reference: the implicit kind's)
        ("rlhf", {"sft_cold", "preferences", "reward_model", "best_of_n", "ppo"}, {"grpo", "rejection", "distill"}),
        ("r1", {"sft_cold", "grpo", "rejection", "sft_rs", "grpo_final"}, {"ppo", "distill", "rounds"}),
        ("r1_zero", {"grpo"}, {"sft_cold", "ppo", "rejection"}),
        ("offline_to_online", {"sft_cold", "preferences", "dpo", "online_dpo"}, {"ppo", "grpo"}),
        ("distill", {"grpo", "student_base", "teacher_data", "sft_distill", "distill"}, {"ppo", "dpo", "rejection"}),
    ],
)
def test_each_pipeline_form_holds_the_sections_its_stages_read(forms, pipeline, holds, lacks):
    sections = set(forms[pipeline].model_fields)
    assert {"seed", "device", "task", "data", "base", "eval"} | holds <= sections
    assert not sections & lacks
    # every stage that samples reads the prompt bound sft.max_prompt_length: the form offers it, and only it, of sft
    if pipeline in ("r1_zero", "offline_to_online"):  # no sft stage of their own
        assert set(forms[pipeline].model_fields["sft"].annotation.model_fields) == {"max_prompt_length"}
    # Placement is the deployment's business; the rounds are the DAG's shape: neither is a field of a run.
    schema = json.dumps(forms[pipeline].model_json_schema())
    assert '"roles"' not in schema and '"runner"' not in schema and '"rounds"' not in schema


def test_a_reward_mix_is_a_group_of_its_weights(forms):
    rewards = forms["r1"].model_json_schema()["$defs"]["grpo_rewards"]
    assert {name: field["default"] for name, field in rewards["properties"].items()} == PARAMS.grpo.rewards
    assert _submitted(forms["r1"]).grpo.rewards.format == PARAMS.grpo.rewards["format"]
    assert changed_overrides(_submitted(forms["r1"], **{"grpo.rewards.format": 0.5}), PARAMS) == [
        "grpo.rewards.format=0.5"
    ]


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_form_submitted_unchanged_overrides_nothing(forms, pipeline):
    assert changed_overrides(_submitted(forms[pipeline]), PARAMS) == []


def test_a_changed_field_is_the_one_override_and_load_params_accepts_it(forms):
    overrides = changed_overrides(_submitted(forms["sft"], **{"sft.lr": 0.0005}), PARAMS)
    assert overrides == ["sft.lr=0.0005"]
    assert load_params(REPO / "params.yaml", overrides).sft.lr == 0.0005
    overrides = changed_overrides(_submitted(forms["sft"], **{"task.name": "arithmetic", "data.num_test": 12}), PARAMS)
    assert overrides == ['task.name="arithmetic"', "data.num_test=12"]
    params = load_params(REPO / "params.yaml", overrides)
    assert (params.task.name, params.data.num_test) == ("arithmetic", 12)


@pytest.mark.parametrize(
    ("pipeline", "bad"),
    [
        ("sft", {"sft": {"lr": -1}}),
        ("sft", {"sft": {"batch_size": 0}}),
        ("sft", {"task": {"name": "no such task"}}),
        ("sft", {"sft": {"lrr": 1}}),
        ("sft", {"x": 1}),
        ("sft", {"ppo": {"steps": 4}}),  # a valid param, but no stage of sft reads it
        ("r1", {"grpo": {"rewards": {"format": float("inf")}}}),
        ("offline_to_online", {"dpo": {"label_smoothing": 0.5}}),
        ("offline_to_online", {"dpo": {"preference_loss": "kto"}}),
        ("offline_to_online", {"online_dpo": {"sync_every": 0}}),
    ],
)
def test_the_form_rejects_what_the_cli_rejects(forms, pipeline, bad):
    with pytest.raises(pydantic.ValidationError):
        forms[pipeline].model_validate(bad)


def test_a_field_the_submission_leaves_out_keeps_what_params_yaml_holds_when_the_run_starts(forms):
    """A long-lived `alignflow serve` built its forms from params.yaml as it was then: a run submitted since with
    some fields (the CLI's overrides) or none (a schedule's) must not put the other fields back to those values."""
    since = load_params(REPO / "params.yaml", ["sft.lr=0.0003", "eval.k=3"])  # another run's overrides, written
    assert changed_overrides(forms["sft"].model_validate({"sft": {"max_steps": 7}}), since) == ["sft.max_steps=7"]
    assert changed_overrides(forms["sft"](), since) == []  # a scheduled run's form: nothing set


def test_cli_overrides_fill_the_form_and_a_key_the_pipeline_does_not_read_is_named(forms):
    values = form_values("sft", forms["sft"], ["sft.lr=1e-4", "sft.num_examples=100", "base.model_path=null"])
    assert changed_overrides(values, PARAMS) == ["sft.lr=0.0001", "sft.num_examples=100"]
    cold = form_values("offline_to_online", forms["offline_to_online"], ["sft_cold.num_examples=null"])
    assert changed_overrides(cold, PARAMS) == ["sft_cold.num_examples=null"]  # the CLI can set a param back to null
    with pytest.raises(ConfigError, match=r"ppo: not a param the sft pipeline's stages read \(they read seed, "):
        form_values("sft", forms["sft"], ["sft.lr=1e-4", "ppo.steps=3"])
    with pytest.raises(ConfigError, match="sft.lr: Input should be greater than 0"):
        form_values("sft", forms["sft"], ["sft.lr=-1"])


def test_overrides_are_written_into_params_yaml_keeping_its_comments(tmp_path):
    params_file = tmp_path / "params.yaml"
    params_file.write_text((REPO / "params.yaml").read_text())
    write_overrides(params_file, ["sft.lr=0.0005", 'task.name="arithmetic"'])
    text = params_file.read_text()
    assert "# Every stage's settings" in text and "# auto | always | never" in text
    params = load_params(params_file)
    assert (params.sft.lr, params.task.name) == (0.0005, "arithmetic")
    assert not list(tmp_path.glob(".tmp-*"))


def test_an_override_stating_a_whole_mix_replaces_it_and_one_entry_merges_in_load_and_in_the_file(tmp_path):
    params_file = tmp_path / "params.yaml"
    params_file.write_text((REPO / "params.yaml").read_text())
    assert dict(PARAMS.grpo.rewards) == {"accuracy": 1.0, "format": 0.1}
    whole = ["grpo.rewards={accuracy: 2.0}", "task.reasoning_gym.datasets={gcd: {weight: 2}}"]
    for params in (load_params(params_file, whole), (write_overrides(params_file, whole), load_params(params_file))[1]):
        assert dict(params.grpo.rewards) == {"accuracy": 2.0}
        assert list(params.task.reasoning_gym.datasets) == ["gcd"]
    one_entry = ["grpo.rewards.format=0.5"]
    assert dict(load_params(params_file, one_entry).grpo.rewards) == {"accuracy": 2.0, "format": 0.5}
    write_overrides(params_file, one_entry)
    assert dict(load_params(params_file).grpo.rewards) == {"accuracy": 2.0, "format": 0.5}


def test_a_whole_mix_after_entries_replaces_them_in_load_and_in_the_file(tmp_path):
    """An overlay stating its reward mix over an overlay it includes that added an entry (examples/reasoning_gym over
    examples/smollm2.args): the mix as stated where the overrides are read and where they are written; an entry
    after the mix merges into it."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text((REPO / "params.yaml").read_text())
    included_then_mix = ["grpo.rewards.digits=1", "grpo.rewards={correct: 1.0, format: 0.1}", "grpo.rewards.tags=0.5"]
    expected = {"correct": 1.0, "format": 0.1, "tags": 0.5}
    assert dict(load_params(params_file, included_then_mix).grpo.rewards) == expected
    write_overrides(params_file, included_then_mix)
    assert dict(load_params(params_file).grpo.rewards) == expected


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RunCancelled])
def test_a_run_cancelled_after_writing_its_overrides_leaves_params_yaml_byte_for_byte(tmp_path, stop):
    """Ctrl-C of `alignflow run`, or a cancel from the UI or a stopping serve: params.yaml as it was, its nulls too."""
    params_file = tmp_path / "params.yaml"
    before = (REPO / "params.yaml").read_bytes()
    params_file.write_bytes(before)
    with pytest.raises(stop), overrides_written(params_file, ["sft.lr=0.0005"]):
        assert load_params(params_file).sft.lr == 0.0005
        raise stop()
    assert params_file.read_bytes() == before
