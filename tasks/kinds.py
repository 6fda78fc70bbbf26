"""Every stage kind, declared once in ``kinds.yaml`` beside this file: the params section it runs with, what it
reads and what it writes.

A stage's name is its kind, then ``@`` and a target for kinds that take one: ``sft``, ``eval@sft``
(the model it evaluates), ``grpo_final@1`` (the round). The CLI's stage lookup and ``--help``,
params validation (which keys name models, which models exist), the Prefect flows and
``flows/generate.py`` (which writes ``dvc.yaml``'s stages) read this table; a stage's module
receives its inputs resolved from ``reads`` and never names its upstream itself.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

import yaml
from pydantic import ConfigDict, Field, TypeAdapter
from pydantic.dataclasses import dataclass

DECLARATIONS = Path(__file__).with_name("kinds.yaml")
PROMPT_PARAMS = ("task.chat_template", "task.system_prompt", "task.response_prefix")  # how a prompt is put to a model


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class StageKind:
    name: str = Field(description="The stage's name in dvc.yaml (before any @).")
    section: str = Field(description="The params section it runs with: its config.")
    entry: str = Field(description="'module:function' that runs it, called with a tasks.common.registry.StageRun.")
    description: str = Field(description="One line, for `alignflow --help` and dvc.yaml.")
    writes: Literal["model", "reward models", "dataset", "evaluation"] = Field(
        description="What it leaves under artifacts/<stage>."
    )
    reads: dict[str, str] = Field(
        default_factory=dict,
        description="Its inputs by the name its module knows them by, each an artifact: a stage ('data'), a params "
        "key of its own section ('${init}') or of another ('${distill.teacher}'), or its target ('${model}', "
        "'rejection@${round}', '${round.policy}').",
    )
    target: Literal["round", "model"] | None = Field(None, description="What follows @ in the stage's name.")
    params: tuple[str, ...] = Field(
        ("seed", "device", "{section}"),
        description="The params keys it reads, as dvc.yaml lists them; '{section}' is its own section. What it "
        "reads of other sections is named key by key, so that a change there re-runs only the stages it touches.",
    )
    prompts: bool = Field(
        True,
        description="Puts the task's prompts to a model, so it also reads the prompt format's params "
        "(PROMPT_PARAMS: tasks/data/prompts.py).",
    )
    user_data: bool = Field(False, description="Reads your JSONL under data/ (a dvc.yaml dependency).")
    metrics: bool = Field(True, description="Logs metrics/<stage>/metrics.json (dvclive).")
    plots: bool = Field(False, description="Logs a training curve (dvclive plots) beside its metrics.")
    curves: bool = Field(
        False,
        description="Writes the gold-vs-proxy curve beside its metrics (tasks/rl/gold_vs_proxy.py: gold and proxy "
        "reward against sqrt(KL)), a plot of its own in dvc.yaml.",
    )
    perf: Literal["run", "steps"] | None = Field(
        None,
        description="Wall-clock numbers it writes, neither an output so that the lock stays put: 'run', "
        "metrics/<stage>/perf.json (throughput, MFU); 'steps', also perf_steps.tsv (each step's phases, seconds).",
    )
    evaluation: str = Field(
        "eval",
        description="The kind (one with target 'model') that evaluates the models it writes: eval on the default "
        "task's held-out split, agent_eval on the agent pipeline's.",
    )
    source: str | None = Field(
        None,
        description="The key of its section naming a model source (base's model_path), read by content: dvc.yaml "
        "lists not the key but the file `fingerprint` names, the source's sha256, which dvc.yaml's sources stage "
        "writes on every repro; new bytes behind the same name re-run the stage, the same bytes under another name "
        "do not.",
    )

    task: str | None = Field(
        None,
        description="The params key naming the task it generates problems of ('{section}' is its own section), "
        "read by content too: dvc.yaml lists the file `task_fingerprint` names, the sha256 of a task module's own "
        "source files, which dvc.yaml's sources stage writes on every repro; the stages that read its data list "
        "it as well, so an edited generator, verifier or environment re-runs what used it.",
    )
    prompt_limit: str | None = Field(
        None,
        description="For a kind that writes a dataset: the params key bounding its prompts in tokens, which every "
        "stage sampling or training on them reads (data: sft.max_prompt_length; agent_data: its SFT's).",
    )

    @property
    def param_keys(self) -> tuple[str, ...]:
        """Every params key it reads, as dvc.yaml lists them and ``alignflow stage NAME --help`` shows them."""
        own = tuple(key.format(section=self.section) for key in self.params)
        return own + (PROMPT_PARAMS if self.prompts else ())

    @property
    def fingerprint(self) -> str | None:
        """The project file standing for its model source (``source``) in dvc.yaml: the source's sha256."""
        return None if self.source is None else f"sources/{self.section}.sha256"

    @property
    def task_key(self) -> str | None:
        """The params key naming its task (``task``, its section filled in)."""
        return None if self.task is None else self.task.format(section=self.section)

    @property
    def task_fingerprint(self) -> str | None:
        """The project file standing for its task module's code in dvc.yaml: the code's sha256."""
        return None if self.task is None else f"sources/{self.section}.task.sha256"


@functools.cache
def stage_kinds() -> dict[str, StageKind]:
    """Every stage kind by name, in declaration order (dvc.yaml's)."""
    declared = yaml.safe_load(DECLARATIONS.read_text())
    kinds = TypeAdapter(list[StageKind]).validate_python([{"name": name, **kind} for name, kind in declared.items()])
    return {kind.name: kind for kind in kinds}


def problem_kinds() -> tuple[str, ...]:
    """The kinds that make a task's train and held-out problem splits (data, agent_data): the data stage's code,
    each on a params section of its own (train_file, test_file, num_train, num_test)."""
    kinds = stage_kinds()
    return tuple(name for name, kind in kinds.items() if kind.entry == kinds["data"].entry)


def prompt_limit_key(section: str) -> str:
    """The params key bounding the prompts the stage of params section ``section`` reads: its dataset's
    (``prompt_limit``), so that the agent pipeline's stages read the agent SFT's, not the default pipelines'."""
    kinds = stage_kinds()
    kind = next(kind for kind in kinds.values() if kind.section == section)
    limit = kinds[kind.reads.get("data", "data")].prompt_limit
    if limit is None:
        raise ValueError(f"tasks/kinds.yaml: {kind.name} reads a dataset without a prompt_limit")
    return limit


def model_kinds(evaluation: str | None = None) -> tuple[list[str], list[str]]:
    """The stage kinds that train a model (those ``evaluation`` evaluates, when given): (one model each, one model
    per round)."""
    models = [kind for kind in stage_kinds().values() if kind.writes == "model"]
    if evaluation is not None:
        models = [kind for kind in models if kind.evaluation == evaluation]
    return [kind.name for kind in models if kind.target is None], [kind.name for kind in models if kind.target]
