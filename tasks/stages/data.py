"""Stages `data` and `agent_data`: the train and held-out splits of a task (``task.name``, or the section's own
``task``: the agent pipeline's), generated from the seed or read from shards of your own under data/."""

import json
from types import SimpleNamespace

from tasks.common.artifacts import atomic_output, stage_dir
from tasks.common.config import Params
from tasks.common.registry import StageRun, param_value
from tasks.common.tracking import stage_live
from tasks.data.datasets import DatasetError, generate_splits, read_located_shards, write_jsonl
from tasks.data.environments import is_agent_task
from tasks.data.problems import BUILT_IN, Example, task_module
from tasks.data.trace_replay import trace_errors
from tasks.kinds import stage_kinds


def splits(params: Params, section: str) -> tuple[list[Example], list[Example]]:
    """The train and held-out splits the section ``section`` (data, agent_data) asks for: read from its shards,
    generated from the seed, or both; DatasetError naming file:line on a bad row, ValueError when a prompt is in
    both splits (a shard of your own that repeats a held-out problem)."""
    cfg, task_name = getattr(params, section), task_of(params, section)
    # a built-in family's settings (task.arithmetic) are read only when the task is that family
    families = {name: getattr(params.task, name) for name in BUILT_IN if name == task_name}
    task = SimpleNamespace(name=task_name, **families)
    # Every row of every shard of your own is validated before anything is generated or written.
    located = {
        split: read_located_shards(source, task.name)
        for split, source in (("train", cfg.train_file), ("test", cfg.test_file))
        if source
    }
    if len(located) < 2:
        generated = generate_splits(task, cfg.num_train, cfg.num_test, params.seed, section)
        for split, rows in zip(("train", "test"), generated, strict=True):
            located.setdefault(split, [(f"{section}'s generated {split} row {i + 1}", e) for i, e in enumerate(rows)])
    train, test = ([example for _, example in located[split]] for split in ("train", "test"))
    overlap = {e.prompt for e in train} & {e.prompt for e in test}
    if overlap:
        raise ValueError(f"{section}: {len(overlap)} prompt(s) are in both splits, e.g. {sorted(overlap)[0]!r}")
    module = task_module(task.name)
    if is_agent_task(module):
        agent = params.agent
        for rows in located.values():
            errors = list(trace_errors(module, rows, agent.tool_timeout_seconds, agent.tool_output_chars))
            if errors:
                more = f" (and {len(errors) - 1} more trace(s))" if len(errors) > 1 else ""
                raise DatasetError(f"{errors[0]}{more}: a worked trace must replay as the task answers it")
    return train, test


def task_of(params: Params, section: str) -> str:
    """The task the section ``section`` (data, agent_data) draws its problems from: the key its kind names."""
    return param_value(params, stage_kinds()[section].task_key)


def run(stage: StageRun) -> None:
    params, cfg = stage.params, stage.config
    task_name = task_of(params, stage.kind.section)
    train, test = splits(params, stage.kind.section)

    with atomic_output(stage_dir(stage.name)) as out, stage_live(stage.name) as live:
        out.mkdir()
        write_jsonl(out / "train.jsonl", train)
        write_jsonl(out / "test.jsonl", test)
        live.log_metric("num_train", len(train), plot=False)
        live.log_metric("num_test", len(test), plot=False)
    read = (("train", train, cfg.train_file), ("test", test, cfg.test_file))
    print(f"{stage.name}: task {task_name}; " + "; ".join(_said(*split) for split in read))


def _said(split: str, rows: list[Example], source: str | None) -> str:
    """What the data stage read for ``split``: its rows, how many repeat an earlier one, and where they came from."""
    repeated = len(rows) - len({json.dumps(row.to_row(), sort_keys=True) for row in rows})
    where = f"read from {source}" if source is not None else "generated from the seed"
    return f"{split} {len(rows)} rows ({where}" + (f", {repeated} repeated" if repeated else "") + ")"
