"""The typed run form: generated from the params dataclasses, validated like the CLI, written into params.yaml."""

import pydantic
import pytest

from flows.overrides import Overrides, to_dotlist
from flows.pipelines import write_overrides
from tasks.common.config import Params
from tasks.common.params import fields_with_keys, load_params
from tests.conftest import REPO


def test_every_param_but_placement_is_in_the_form_with_its_description():
    schema = Overrides.model_json_schema()

    def described(model_schema: dict, prefix: str = "") -> set[str]:
        keys = set()
        for name, field in model_schema["properties"].items():
            assert field.get("description"), f"{prefix}{name} has no description"
            reference = next((option["$ref"] for option in field.get("anyOf", []) if "$ref" in option), None)
            if reference:
                keys |= described(schema["$defs"][reference.split("/")[-1]], f"{prefix}{name}.")
            else:
                keys.add(f"{prefix}{name}")
        return keys

    def form_key(key: str) -> str:  # the form takes the rounds as one dict-valued field, as it does rewards
        return "rounds" if key.startswith("rounds.") else key

    placement = [key for key, _, _ in fields_with_keys(Params()) if key.startswith("runner.") or ".roles." in key]
    expected = {form_key(key) for key, _, _ in fields_with_keys(Params()) if key not in placement}
    assert described(schema) == expected


@pytest.mark.parametrize(
    "bad",
    [
        {"sft": {"lr": -1}},
        {"sft": {"batch_size": 0}},
        {"task": {"name": "sudoku"}},
        {"sft": {"lrr": 1}},
        {"x": 1},
        {"dpo": {"label_smoothing": 0.5}},
        {"dpo": {"loss": "kto"}},
        {"online_dpo": {"sync_every": 0}},
    ],
)
def test_the_form_rejects_what_the_cli_rejects(bad):
    with pytest.raises(pydantic.ValidationError):
        Overrides.model_validate(bad)


def test_set_fields_become_dotlist_overrides_that_load_params_accepts():
    overrides = Overrides.model_validate(
        {"sft": {"lr": 0.0005, "max_steps": 10}, "task": {"arithmetic": {"digits": 2}}}
    )
    dotlist = to_dotlist(overrides)
    assert sorted(dotlist) == ["sft.lr=0.0005", "sft.max_steps=10", "task.arithmetic.digits=2"]
    params = load_params(REPO / "params.yaml", dotlist)
    assert (params.sft.lr, params.sft.max_steps, params.task.arithmetic.digits) == (0.0005, 10, 2)
    assert to_dotlist(None) == [] and to_dotlist(Overrides()) == []


def test_overrides_are_written_into_params_yaml_keeping_its_comments(tmp_path):
    params_file = tmp_path / "params.yaml"
    params_file.write_text((REPO / "params.yaml").read_text())
    write_overrides(params_file, ["sft.lr=0.0005", "task.name=arithmetic"])
    text = params_file.read_text()
    assert "# Every stage's settings" in text and "# arithmetic | countdown" in text
    params = load_params(params_file)
    assert (params.sft.lr, params.task.name) == (0.0005, "arithmetic")
    assert not list(tmp_path.glob(".tmp-*"))
