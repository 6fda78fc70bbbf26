"""A pipeline's run form: the params its stages read, at their current values, as one pydantic model.

Prefect builds a deployment's parameter form (and validates runs created through its API) from the
flow's signature. A pipeline's flow takes one argument whose model holds exactly the params that the
pipeline's dvc.yaml stages list under ``params:``, each the schema's own field (type, help,
bounds, choices) with, as its default, the value params.yaml holds; each section is a group titled with
its key and its help in ``tasks/common/config``. The form sends every value; only those that differ
from params.yaml become overrides, which ``load_params`` validates with the CLI's rules (cross-field
ones too) before the flow writes them into params.yaml.
"""

import dataclasses
import json
import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_serializer
from pydantic.fields import FieldInfo

from flows.runner import read_dag
from tasks.common.config import ConfigError, Params
from tasks.common.config.fields import schema_fields
from tasks.kinds import stage_kinds
from tasks.params.load import REPLACED_BY_THE_FILE, overrides_in_order
from tasks.pipelines import PIPELINES

# Where work is placed (Ray addresses, resources, workers per role or stage) is the deployment's business, not a
# run's: it stays in params.yaml.
_PLACEMENT = ("runner", "roles", "parallel")


class _Group(BaseModel):
    """A group of the form: unknown keys are refused, and a null param is left out of what it serialises to."""

    model_config = ConfigDict(extra="forbid")

    # Prefect's form fills itself from this serialisation (the flow parameter's default), and sends what it holds:
    # a null there, against a field of a plain type, would make the server refuse every submission.
    @model_serializer(mode="wrap")
    def _without_nulls(self, serialize: Any) -> dict[str, Any]:
        return {name: value for name, value in serialize(self).items() if value is not None}


def pipeline_keys(pipeline: str, params: Params, project: Path) -> list[str]:
    """The params keys the stages of ``pipeline`` read, as dvc.yaml lists them, in the order the stages run;
    a key inside a section that is listed whole is left out (``eval.batch_size`` beside ``eval``)."""
    keys: list[str] = []
    for stage in read_dag(project, PIPELINES[pipeline].stages(params)):
        # A model source is a dep by content, not a param of dvc.yaml; the form still sets its name.
        kind = stage_kinds().get(stage.name.partition("@")[0])
        source = [f"{kind.section}.{kind.source}"] if kind is not None and kind.source is not None else []
        keys += [key for key in (*stage.params, *source) if key not in keys]
    return [key for key in keys if not any(key.startswith(f"{other}.") for other in keys)]


def dag_project(here: Path) -> Path:
    """The project whose dvc.yaml says which params each pipeline reads: ``here``'s, else this source tree's."""
    return here if (here / "dvc.yaml").is_file() else Path(__file__).resolve().parents[1]


def form_model(pipeline: str, params: Params, project: Path = Path(".")) -> type[BaseModel]:
    """The run form of ``pipeline`` in ``project``: every param its stages read, defaulting to its value in
    ``params``."""
    selected: dict[str, Any] = {}
    for key in pipeline_keys(pipeline, params, project):
        *sections, name = key.split(".")
        node = selected
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = True
    return _group(params, selected, "", f"{pipeline}_form")


def _group(config: Any, selected: dict[str, Any] | Literal[True], prefix: str, name: str) -> type[BaseModel]:
    """A model of the fields of ``config`` (the params under ``prefix``) that ``selected`` names (True: all of
    them), defaulting to their values."""
    fields: dict[str, Any] = {}
    for field_name, info in schema_fields(type(config)).items():
        if field_name in _PLACEMENT or (selected is not True and field_name not in selected):
            continue
        key, value, help = f"{prefix}{field_name}", getattr(config, field_name), info.description or ""
        if dataclasses.is_dataclass(value):
            below = True if selected is True else selected[field_name]
            fields[field_name] = _titled(_group(value, below, f"{key}.", key.replace(".", "_")), key, help)
        elif isinstance(value, dict):
            if (weights := _weights(value, key)) is not None:
                fields[field_name] = _titled(weights, key, help)
        else:
            fields[field_name] = _field(info, key, value)
    # Named after its key (sft, task_countdown), so the schema's definitions read as the params they hold.
    return create_model(name, __base__=_Group, **fields)


def _titled(group: type[BaseModel], key: str, help: str) -> tuple[type[BaseModel], Any]:
    """A group's field, titled with its key and the help of its section (``sft — Supervised fine-tuning ...``)."""
    # pydantic leaves the title off a field that refers to a model, and Prefect's form would then label the group
    # with its bare key: the title goes into the field's schema as it stands.
    title = f"{key} — {help.rstrip('.')}"
    return group, Field(group(), title=title, json_schema_extra={"title": title})


def _weights(mix: dict[str, Any], key: str) -> type[BaseModel] | None:
    """A reward mix as one number field per reward it holds; None for a dict of sections (``rounds``) or a mix
    with nothing the form can offer.

    Which rewards a mix holds, or which rounds R1 runs, is not a value the form can change: an override merges
    into a dict key by key and never removes one. So the form offers the weights of the rewards params.yaml
    names, but not a reward of your own (``module:function`` is no override key) nor the rounds: those are
    edited in params.yaml.
    """
    if not all(isinstance(weight, float | int) for weight in mix.values()):
        return None
    fields = {
        name: (float, Field(weight, title=f"{key}.{name}", allow_inf_nan=False))
        for name, weight in mix.items()
        if name.isidentifier()
    }
    return create_model(key.replace(".", "_"), __base__=_Group, **fields) if fields else None


def _plain(schema: dict[str, Any]) -> None:
    """A nullable field's schema as its plain type: Prefect's form shows a union as a type toggle hiding the value,
    and a type list (["integer", "null"]) as no input at all."""
    schema.update(next(option for option in schema.pop("anyOf") if option.get("type") != "null"))
    if schema.get("default", 0) is None:
        del schema["default"]  # an empty field, left out of what the form sends


def _field(info: FieldInfo, key: str, value: Any) -> tuple[Any, Any]:
    """A param's field: the schema's own type, constraints and help, titled with its full key and defaulting to
    its value in params.yaml."""
    extra = None
    if typing.get_origin(info.annotation) in (typing.Union, types.UnionType):
        # Null stays valid (the CLI's `sft.num_examples=null`), but the form cannot send it: a field emptied there
        # is left out, which keeps the value params.yaml holds.
        extra = _plain
    annotation = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    return annotation, Field(value, title=key, description=info.description, json_schema_extra=extra)


def _leaves(values: BaseModel, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(key, value) of every field the submission set, in the form's order: a field it left out keeps whatever
    params.yaml holds when the run starts, not the default the form was built with."""
    for name in type(values).model_fields:
        if name not in values.model_fields_set:
            continue
        value = getattr(values, name)
        if isinstance(value, BaseModel):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def _current(params: Params, key: str) -> Any:
    value: Any = params
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else getattr(value, part)
    return value


def changed_overrides(values: BaseModel, params: Params) -> list[str]:
    """The dotlist overrides (``['sft.lr=0.0001']``) that set what the form ``values`` hold where it differs from
    ``params``: none for a form submitted unchanged. Only what the submission set counts: the UI's form sends every
    value, the CLI (and a served ``alignflow run``) only its overrides, and a scheduled run none."""
    # JSON quotes a string, so a value such as "1" or "null" stays a string through omegaconf's and DVC's parsers.
    return [f"{key}={json.dumps(value)}" for key, value in _leaves(values) if value != _current(params, key)]


def split_by_form(form: type[BaseModel], overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the overrides ``form`` holds a field for, the others), each in the order given. The others are params of
    stages the pipeline does not run (an overlay written for every pipeline sets them) and every override of a mix:
    a reward new to it has no field, and a mix stated whole replaces the entries before it, which only params.yaml
    can take (``write_overrides``)."""
    held: list[str] = []
    others: list[str] = []
    for override in overrides:
        key = override.partition("=")[0].strip()
        in_a_mix = any(key == mix or key.startswith(f"{mix}.") for mix in REPLACED_BY_THE_FILE)
        (held if not in_a_mix and _holds(form, key) else others).append(override)
    return held, others


def _holds(form: type[BaseModel], key: str) -> bool:
    def is_group(node: Any) -> bool:
        return isinstance(node, type) and issubclass(node, BaseModel)

    node: Any = form
    for part in key.split("."):
        if not is_group(node) or part not in node.model_fields:
            return False
        node = node.model_fields[part].annotation
    return not is_group(node)


def form_values(pipeline: str, form: type[BaseModel], overrides: Sequence[str]) -> BaseModel:
    """The form of ``pipeline`` filled in from dotlist ``overrides`` (the rest at its defaults), as the CLI takes
    them; a key the form does not hold, or a value it refuses, is a ConfigError naming the key."""
    try:
        return form.model_validate(OmegaConf.to_container(overrides_in_order(overrides)))
    except ValidationError as error:
        errors = []
        for problem in error.errors():
            key = ".".join(str(part) for part in problem["loc"])
            if problem["type"] == "extra_forbidden":
                takes = ", ".join(form.model_fields)
                errors.append(f"{key}: not a param the {pipeline} pipeline's stages read (they read {takes})")
            else:
                errors.append(f"{key}: {problem['msg']}")
        raise ConfigError("invalid override:\n  " + "\n  ".join(errors)) from None
