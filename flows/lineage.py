"""`alignflow lineage MODEL[@VERSION]`: the chain of stages that produced a registered model version.

Read from that version's own dvc.lock (the commit its registry tag points to), never from the workspace: each
stage's command, params and dependencies with their DVC hashes, walking from the model through the upstream
models to the data, whose shards are listed one by one with their hashes.
"""

import hashlib
from pathlib import Path
from typing import Any

import yaml
from dvc.api import DVCFileSystem

from flows.registry import commit_of, parse_version, pipeline_of, prod_version
from tasks.common.artifacts import ARTIFACTS, USER_DATA
from tasks.common.config import ConfigError
from tasks.data.datasets import is_shard_of


def resolve(project: Path, reference: str) -> tuple[str, str, str]:
    """``sft@v3`` -> ("sft", "v3.0.0", commit); a bare ``sft`` means the version in prod."""
    artifact, _, version = reference.partition("@")
    pipeline_of(artifact)
    if version:
        version = parse_version(version)
        return artifact, version, commit_of(project, artifact, version)
    in_prod = prod_version(project, artifact)
    if in_prod is None:
        raise ConfigError(f"{artifact}: no version in prod; name one ({artifact}@vN)")
    return artifact, *in_prod


def recorded_model(project: Path, artifact: str, version: str, commit: str) -> tuple[DVCFileSystem, dict, str]:
    """(the commit's files, its dvc.lock's stages, the model's path) of a registered version; ConfigError naming
    the tag when its commit records no model (a tag made by hand on a commit without one)."""
    tag, fs = f"{artifact}@{version}", DVCFileSystem(str(project), rev=commit)
    found = {}
    for name, keys in (("dvc.lock", ("stages",)), ("dvc.yaml", ("artifacts", artifact, "path"))):
        try:
            found[name] = yaml.safe_load(fs.read_text(name))
            for key in keys:
                found[name] = found[name][key]
        except FileNotFoundError:
            raise ConfigError(f"{tag}: its commit {commit[:8]} has no {name}") from None
        except (KeyError, TypeError):
            raise ConfigError(f"{tag}: its commit's {name} has no {'.'.join(keys)}") from None
    lock, path = found["dvc.lock"], found["dvc.yaml"]
    if not any(out["path"] == path for stage in lock.values() for out in stage.get("outs", [])):
        raise ConfigError(f"{tag}: its commit {commit[:8]} holds no model: its dvc.lock records no {path}")
    return fs, lock, path


def lineage(project: Path, reference: str) -> dict[str, Any]:
    """The model's version, commit and path, and every stage behind it, model first, as its dvc.lock records."""
    artifact, version, commit = resolve(project, reference)
    fs, lock, path = recorded_model(project, artifact, version, commit)
    producer = {out["path"]: name for name, stage in lock.items() for out in stage.get("outs", [])}
    chain, pending, seen = [], [producer[path]], set()
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.add(name)
        stage = lock[name]
        deps = {dep["path"]: dep.get("md5") for dep in stage.get("deps", [])}
        chain.append(
            {
                "stage": name,
                "cmd": stage["cmd"],
                "params": stage.get("params", {}).get("params.yaml", {}),
                "models_and_data": {p: md5 for p, md5 in deps.items() if p.startswith(f"{ARTIFACTS}/")},
                "code": {p: md5 for p, md5 in deps.items() if not p.startswith((f"{ARTIFACTS}/", str(USER_DATA)))},
                "outs": {out["path"]: out.get("md5") for out in stage.get("outs", [])},
                **({"shards": _shards(fs, own_files(stage))} if str(USER_DATA) in deps else {}),
            }
        )
        pending += [producer[p] for p in deps if p in producer]
    return {"model": artifact, "version": version, "commit": commit, "path": path, "stages": chain}


def shards_at(project: Path, commit: str) -> dict[str, str]:
    """The shards the data stage read as of ``commit`` (by that commit's dvc.lock), with their md5s."""
    fs = DVCFileSystem(str(project), rev=commit)
    data_stage = yaml.safe_load(fs.read_text("dvc.lock"))["stages"]["data"]
    return _shards(fs, data_stage["params"]["params.yaml"]["data"])


def own_files(stage: dict[str, Any]) -> dict[str, Any]:
    """The section of a stage's recorded params that names files of your own under data/ (data's, agent_data's,
    preferences')."""
    sections = stage.get("params", {}).get("params.yaml", {}).values()
    return next((v for v in sections if isinstance(v, dict) and {"train_file", "test_file"} & set(v)), {})


def _shards(fs: DVCFileSystem, data: dict[str, Any]) -> dict[str, str]:
    """The shards the data section ``data`` reads in ``fs``'s commit, with their md5s: DVC's (each shard's .dvc file
    records it), or of the bytes git holds."""
    sources = [data[key] for key in ("train_file", "test_file") if data.get(key)]
    if not sources or not fs.exists(str(USER_DATA)):
        return {}
    found = fs.find(str(USER_DATA), detail=True)
    return {
        path: info.get("md5") or hashlib.md5(fs.read_bytes(path)).hexdigest()
        for path, info in sorted(found.items())
        if any(is_shard_of(path, source) for source in sources)
    }


def render(found: dict[str, Any]) -> str:
    lines = [f"{found['model']}@{found['version']}  commit {found['commit']}  ({found['path']})"]
    for stage in found["stages"]:
        lines += ["", f"stage {stage['stage']}: {stage['cmd']}"]
        for key, value in _flat(stage["params"]):
            lines.append(f"  param   {key} = {value}")
        for label in ("outs", "models_and_data", "shards", "code"):
            for path, md5 in stage.get(label, {}).items():
                lines.append(f"  {label.split('_')[0]:<7} {path}  {md5}")
    return "\n".join(lines)


def _flat(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items = []
    for key, value in tree.items():
        items += _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [(f"{prefix}{key}", value)]
    return items
