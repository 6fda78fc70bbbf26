"""dvc.yaml and params.yaml, written from the declarations: the stage kinds (``tasks/kinds.yaml``) and the
params schema (``tasks/common/config``).

A stage kind is declared once; its dvc.yaml entry (command, inputs, code, params, outputs, metrics) is derived:
the artifacts it reads from its ``reads`` (``${...}`` left for DVC to interpolate from params.yaml), its code
from what its entry module imports, transitively. params.yaml is every section at its value, with the section's
help above it. ``alignflow generate`` writes both; ``alignflow generate --check`` (and the test suite) fails
when either is out of date.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from flows.fingerprints import SOURCES_STAGE, fingerprinted
from flows.imports import REPO, has_code, transitive_imports
from tasks.common.artifacts import CURVE_FILE, PERF_FILE, PERF_STEPS_FILE, model_dir
from tasks.common.config import Params
from tasks.common.config.fields import schema_fields
from tasks.common.registry import param_reference
from tasks.kinds import StageKind, model_kinds, stage_kinds
from tasks.pipelines import PIPELINES

# The shared library every stage leans on is listed whole; the rest file by file, or by package when a stage
# imports all of it.
_LIBRARY = ("tasks/common", "models")
# The loader of the declarations dvc.yaml is written from: a change to a stage kind shows in dvc.yaml itself.
_DECLARATIONS = ("tasks/kinds.py",)
_WIDTH = 120

_DVC_HEADER = """\
# Written by `alignflow generate` from tasks/kinds.yaml (one declaration per stage kind) and params.yaml:
# edit those, then run it; `alignflow generate --check` (run by the tests) fails when this file is stale.
#
# The pipelines (tasks/pipelines.py names them; `alignflow repro <pipeline>` runs one):
{pipelines}
# and every trained model is evaluated on the held-out split (eval@<model>).
# Every stage runs `alignflow stage <name>`, reads its settings from params.yaml, writes to a
# temporary path and renames on success. `alignflow report` prints the metrics in this order.
# Code deps list every module a stage's entry point imports: the shared library (tasks/common, models),
# then the packages and modules of the stage's own kind.
"""


def _wrapped(text: str, first: str, rest: str) -> Iterator[str]:
    """``text`` as comment lines no wider than the file's lines."""
    line = first
    for word in text.split():
        if len(line) + len(word) + 1 > _WIDTH and line.strip() not in ("#", ""):
            yield line.rstrip()
            line = rest
        line += word + " "
    yield line.rstrip()


@functools.cache  # the code does not change while a process runs; parsing it is most of what generating costs
def _code_deps(entry: str) -> tuple[str, ...]:
    """The files a stage's entry module imports, transitively: its own module first, then the library, then the
    rest (a package whose every module is imported named once)."""
    module = entry.partition(":")[0]
    imported = transitive_imports(module)
    files = {str(path.relative_to(REPO)) for path in imported.values() if has_code(path)}
    own = str(imported[module].relative_to(REPO))
    deps = {own}
    for path in sorted(files - {own, *_DECLARATIONS}):
        library = next((root for root in _LIBRARY if path.startswith(f"{root}/")), None)
        if library is not None:
            deps.add(library)
            continue
        package = str(Path(path).parent)
        in_package = {str(p.relative_to(REPO)) for p in (REPO / package).glob("*.py") if has_code(p)}
        deps.add(package if in_package <= files else path)
    ordered = [own, *[root for root in _LIBRARY if root in deps]]
    return (*ordered, *sorted(deps - set(ordered)))


def _artifact(read: str, kind: StageKind, variable: str) -> str:
    """A read as dvc.yaml's dependency: ``artifacts/${sft.init}``, ``artifacts/sft_rs/${key}``."""
    if (key := param_reference(read, kind.section)) is not None:
        return f"artifacts/${{{key}}}"
    read = read.replace("${round.policy}", "${item.policy}").replace(f"${{{kind.target}}}", variable)
    return "artifacts/" + read.replace("@", "/")


def _dvc_params(kind: StageKind) -> list[str]:
    """The params keys dvc.yaml lists for ``kind``: its own section key by key less its model source, which DVC
    reads through the source's fingerprint (a dep), so that a new name for the same bytes re-runs nothing."""
    if kind.source is None:
        return list(kind.param_keys)
    fields = schema_fields(schema_fields(Params)[kind.section].annotation)
    own = [f"{kind.section}.{name}" for name in fields if name != kind.source]
    return [key for listed in kind.param_keys for key in (own if listed == kind.section else [listed])]


def _tasks(kind: StageKind) -> list[tuple[str, str]]:
    """(fingerprint file, params key) of each task whose problems ``kind`` generates or reads: its verifier and
    environment are the stage's code as much as its own modules are."""
    kinds = stage_kinds()
    writers = [kind, *(kinds[read] for read in kind.reads.values() if read in kinds)]
    return [(writer.task_fingerprint, writer.task_key) for writer in writers if writer.task is not None]


def _entry(kind: StageKind, name: str, foreach: list[str] | str | None, target: str) -> list[str]:
    """One dvc.yaml stage (or foreach group) of ``kind``; ``target`` is what follows @ in its stages' names."""
    deps = ["data  # your own JSONL and incoming shards: a new shard retrains"] if kind.user_data else []
    deps += [_artifact(read, kind, target) for read in kind.reads.values()] + list(_code_deps(kind.entry))
    if kind.fingerprint is not None:
        deps.append(f"{kind.fingerprint}  # {kind.section}.{kind.source} by content (the {SOURCES_STAGE} stage)")
    deps += [f"{file}  # {key}'s code by content (the {SOURCES_STAGE} stage)" for file, key in _tasks(kind)]
    command = f"{kind.name}@{target}" if kind.target else kind.name
    out = command.replace("@", "/")
    lines = [f"  {name}:", *_wrapped(kind.description, "    # ", "    # ")]
    body = [f"cmd: alignflow stage {command}", "deps:", *[f"  - {dep}" for dep in deps], "params:"]
    body += [f"  - {key}" for key in _dvc_params(kind)]
    body += ["outs:", f"  - artifacts/{out}"]
    if kind.metrics:
        body += ["metrics:", f"  - metrics/{out}/metrics.json:", "      cache: false"]
    if kind.plots:
        body += ["plots:", f"  - metrics/{out}/plots/metrics:", "      x: step", "      cache: false"]
    if foreach is None:
        return lines + [f"    {line}" for line in body]
    if isinstance(foreach, str):
        lines += [f"    foreach: {foreach}"]
    else:
        lines += ["    foreach:", *[f"      - {item}" for item in foreach]]
    return lines + ["    do:", *[f"      {line}" for line in body]]


def _sources_stage() -> list[str]:
    """The stage that writes the fingerprints the others list: DVC runs it on every repro, and a file whose source
    did not change keeps its bytes (``persist``: DVC does not delete it first), so nothing downstream re-runs. It
    lists no params: it runs whatever they say, and the stages that read a fingerprint list the rest of theirs."""
    files = fingerprinted()
    lines = [
        f"  {SOURCES_STAGE}:",
        *_wrapped(
            "the sha256 of each model source and task module of your own that params name, a file each: run on "
            "every repro, so dvc status and dvc repro see new bytes behind the same name",
            "    # ",
            "    # ",
        ),
        "    cmd: alignflow fingerprints",
        "    always_changed: true",
        "    outs:",
    ]
    for file, _ in files:
        lines += [f"      - {file}:", "          cache: false", "          persist: true"]
    return lines


def _stages() -> Iterator[list[str]]:
    yield _sources_stage()
    for kind in stage_kinds().values():
        if kind.target == "model":  # a stage per model it evaluates: one group, and one per kind trained per round
            models, round_models = model_kinds(kind.name)
            yield _entry(kind, kind.name, models, "${item}")
            for model in round_models:
                yield _entry(kind, f"{kind.name}_{model}", "${rounds}", f"{model}/${{key}}")
        elif kind.target == "round":
            yield _entry(kind, kind.name, "${rounds}", "${key}")
        else:
            yield _entry(kind, kind.name, None, "")


def render_dvc_yaml(params: Params) -> str:
    """dvc.yaml for ``params`` (its rounds decide which model r1 registers)."""
    pipelines = []
    for name, pipeline in PIPELINES.items():
        pipelines += _wrapped(pipeline.description, f"#   {name}: ", "#       ")
    out = [_DVC_HEADER.format(pipelines="\n".join(pipelines)), "stages:"]
    for stage in _stages():
        out += [*stage, ""]
    perf = [kind for kind in stage_kinds().values() if kind.perf]
    out += ["# Throughput, MFU and step times of the stages that train: beside the lock, not outputs (they vary);"]
    out += [
        "# and the gold-vs-proxy curves (gold and proxy reward against sqrt(KL)) of the stages that optimise a proxy."
    ]
    out += ["metrics:", *[f"  - metrics/{kind.name}/{PERF_FILE}" for kind in perf], "plots:"]
    for kind in perf:
        if kind.perf == "steps":
            out += [f"  - metrics/{kind.name}/{PERF_STEPS_FILE}:", "      x: step", "      y: [generate, score, train]"]
    # A top-level plot: a stage's own plots take one y, and the curve is read with two.
    for kind in stage_kinds().values():
        if kind.curves:
            out += [f"  - metrics/{kind.name}/{CURVE_FILE}:", "      x: sqrt_kl", "      y: [gold, proxy]"]
    out += [""]
    out += [
        "# The model each pipeline delivers, as `alignflow retrain PIPELINE` registers it: GTO version tags",
        "# (<name>@vN.0.0) and stage tags (<name>#prod#K) on the commits holding its dvc.lock (`alignflow registry`).",
        "artifacts:",
    ]
    for name, pipeline in PIPELINES.items():
        out += [f"  {name.replace('_', '-')}:", f"    path: {model_dir(pipeline.model(params))}", "    type: model"]
        out += [f"    desc: {pipeline.delivers_desc}"]
    return "\n".join(out) + "\n"


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def _value_lines(key: str, value: Any, indent: str) -> list[str]:
    """``key: value``, a mapping on one line when it fits, else as a block."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        plain = {name: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for name, v in value.items()}
        inline = f"{indent}{key}: {_scalar(plain)}"
        if len(inline) <= _WIDTH or not plain:
            return [inline]
        return [
            f"{indent}{key}:",
            *[line for name, v in plain.items() for line in _value_lines(name, v, indent + "  ")],
        ]
    return [f"{indent}{key}: {_scalar(value)}"]


def _choices(info: Any) -> str:
    constraint = next((m for m in info.metadata if hasattr(m, "choices")), None)
    return f"  # {' | '.join(constraint.choices)}" if constraint is not None else ""


def render_params_yaml(params: Params) -> str:
    """params.yaml holding ``params``: every section with its help, every choice-valued key with its choices."""
    out = [
        "# Every stage's settings, by section (`alignflow stage <stage> --help` documents each key, with its bounds).",
        "# Written by `alignflow generate` from the schema (tasks/common/config) and this file's own values.",
    ]
    for name, info in schema_fields(Params).items():
        value = getattr(params, name)
        out.append("")
        out += _wrapped(info.description, "# ", "# ")
        if not dataclasses.is_dataclass(value):
            out += [line + _choices(info) for line in _value_lines(name, value, "")]
            continue
        out.append(f"{name}:")
        for field_name, field_info in schema_fields(type(value)).items():
            lines = _value_lines(field_name, getattr(value, field_name), "  ")
            out += [lines[0] + _choices(field_info), *lines[1:]]
    return "\n".join(out) + "\n"


def generated(project: Path) -> dict[Path, str]:
    """dvc.yaml and params.yaml as they should read, from the project's params.yaml."""
    from tasks.params.load import load_params

    params = load_params(project / "params.yaml")
    return {project / "dvc.yaml": render_dvc_yaml(params), project / "params.yaml": render_params_yaml(params)}


def stale(project: Path) -> list[Path]:
    """The generated files that differ from what the declarations give."""
    return [path for path, text in generated(project).items() if not path.is_file() or path.read_text() != text]
