"""The model registry: GTO's git tags over the ``artifacts:`` of dvc.yaml, one artifact per pipeline.

A version is an annotated tag ``<artifact>@vN.0.0`` on the commit that holds the candidate's dvc.lock (its DVC
experiment commit); the tag's message is the gate's decision as JSON. A stage assignment is a tag
``<artifact>#prod#K`` whose message says who assigned it and why (the gate, or a person through
``alignflow promote`` / ``rollback``). Everything here is GTO's own API, so ``gto show``, ``gto history``,
``dvc.api.artifacts_show(name, stage="prod")`` and DVC Studio read the same registry.
"""

import json
import re
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import gto.api
from gto.exceptions import ArtifactNotFound

from tasks.common.artifacts import model_dir
from tasks.common.config import ConfigError, Params
from tasks.pipelines import PIPELINES

PROD = "prod"
_AUTHOR = {"author": "alignflow", "author_email": "alignflow@localhost"}
_VERSION = re.compile(r"v?(\d+)(?:\.0\.0)?")


def artifact_name(pipeline: str) -> str:
    """The registry's name for what ``pipeline`` delivers (GTO names allow no underscores): ``offline-to-online``."""
    return pipeline.replace("_", "-")


def pipeline_of(artifact: str) -> str:
    pipeline = artifact.replace("-", "_")
    if pipeline not in PIPELINES:
        known = ", ".join(artifact_name(name) for name in PIPELINES)
        raise ConfigError(f"no registered model {artifact!r} (models: {known})")
    return pipeline


def check_artifact_path(project: Path, pipeline: str, params: Params) -> Path:
    """The model directory dvc.yaml's ``artifacts:`` declares for ``pipeline``; an error naming the entry when it
    is not the model the pipeline trains with these params (e.g. r1's last round moved)."""
    from flows.dag import open_repo

    name, expected = artifact_name(pipeline), model_dir(PIPELINES[pipeline].model(params))
    with open_repo(project) as repo:
        declared = repo.artifacts.read().get("dvc.yaml", {}).get(name)
    if declared is None or Path(declared.path) != expected:
        got = "nothing" if declared is None else repr(declared.path)
        raise ConfigError(
            f"dvc.yaml: artifacts.{name}.path must be {str(expected)!r}, the model {pipeline} trains; got {got}"
        )
    return expected


@dataclass
class Decision:
    """What the gate decided about a candidate, with its numbers: the registration tag's message."""

    promoted: bool
    reason: str
    candidate: dict[str, float]
    champion: dict[str, float] | None = None
    champion_version: str | None = None
    new_shards: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    push: str = "not pushed"

    def message(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def parse_version(version: str) -> str:
    """``v3``, ``3`` or ``v3.0.0`` -> ``v3.0.0``."""
    match = _VERSION.fullmatch(version)
    if match is None:
        raise ConfigError(f"not a version: {version!r} (expected vN or vN.0.0)")
    return f"v{match.group(1)}.0.0"


def _major(version: str) -> int:
    return int(_VERSION.fullmatch(version).group(1))


def _versions(project: Path, artifact: str) -> list[dict[str, Any]]:
    try:
        return gto.api.show(str(project), artifact, registered_only=True, assignments_per_version=-1)
    except ArtifactNotFound:  # GTO knows an artifact from its first tag on
        return []


def register(project: Path, artifact: str, commit: str, decision: Decision) -> str:
    """Register ``commit`` as the next version of ``artifact`` (v1.0.0, v2.0.0, ...: each candidate is a new
    model, and people call them v1, v2); return the version."""
    taken = [_major(entry["version"]) for entry in _versions(project, artifact)]
    version = f"v{max(taken, default=0) + 1}.0.0"
    gto.api.register(str(project), artifact, commit, version=version, message=decision.message(), **_AUTHOR)
    return version


def assign_prod(project: Path, artifact: str, version: str, why: str) -> None:
    """Put ``version`` in prod and take the version there out of it, so exactly one is: GTO's own lookup prefers
    the highest version in a stage, DVC's the latest assignment, and after a rollback those would differ."""
    current = prod_version(project, artifact)
    if current is not None and current[0] != version:
        _next_second(project, artifact)
        gto.api.unassign(
            str(project), artifact, version=current[0], stage=PROD, message=f"replaced by {version}", **_AUTHOR
        )
    # The assignment comes last, in a second of its own: DVC's lookup takes the stage's latest tag whatever its
    # action, so an unassignment tagged a second after it would name the version just taken out.
    _next_second(project, artifact)
    # force: a version back in prod (a rollback) is a new assignment tag, #prod#K+1, not an error
    gto.api.assign(str(project), artifact, PROD, version=version, message=why, force=True, **_AUTHOR)


def _next_second(project: Path, artifact: str) -> None:
    """Wait, if need be, for a second no event of ``artifact`` happened in: GTO orders a version's events by their
    tags' timestamps, which git keeps to the second, so a version unassigned and assigned again within one second
    (a rollback straight after a promotion) would have no order."""
    try:
        latest = max(event["timestamp"] for event in gto.api.history(str(project), artifact))
    except (ArtifactNotFound, ValueError):
        return
    wait = latest.timestamp() + 1 - time.time()
    if wait > 0:
        time.sleep(wait)


def prod_version(project: Path, artifact: str) -> tuple[str, str] | None:
    """(version, commit) of ``artifact`` in ``prod``, or None before any promotion."""
    try:
        in_prod = gto.api.find_versions_in_stage(str(project), artifact, PROD)
    except ArtifactNotFound:
        return None
    return None if not in_prod else (in_prod[0].version, in_prod[0].commit_hexsha)


def commit_of(project: Path, artifact: str, version: str) -> str:
    for entry in _versions(project, artifact):
        if entry["version"] == version:
            return entry["commit_hexsha"]
    raise ConfigError(f"{artifact}: no version {version} (see `alignflow registry`)")


def rollback(project: Path, artifact: str, who: str) -> str:
    """Put back in ``prod`` the version that was there before the current one; return it."""
    try:
        history = gto.api.history(str(project), artifact, ascending=True)
    except ArtifactNotFound:
        history = []
    promoted = [event["version"] for event in history if event["event"] == "assignment" and event["stage"] == PROD]
    current = prod_version(project, artifact)
    earlier = [version for version in promoted if current is None or version != current[0]]
    if not earlier:
        raise ConfigError(f"{artifact}: no earlier prod version to roll back to")
    assign_prod(project, artifact, earlier[-1], f"rollback from {current[0] if current else 'nothing'} by {who}")
    return earlier[-1]


def registry(project: Path) -> list[dict[str, Any]]:
    """Every registered version of every pipeline's model in version (so registration) order: its commit, stages,
    the gate's decision with its numbers, and the history of its stage assignments (when, who and why)."""
    rows = []
    for pipeline in PIPELINES:
        artifact = artifact_name(pipeline)
        versions = sorted(_versions(project, artifact), key=lambda e: _major(e["version"]))
        history = gto.api.history(str(project), artifact, ascending=True) if versions else []
        for entry in versions:
            registration = entry["registrations"][-1]
            rows.append(
                {
                    "model": artifact,
                    "version": entry["version"],
                    "commit": entry["commit_hexsha"],
                    "registered": registration["created_at"].isoformat(),
                    "stages": sorted({s["stage"] for s in entry["stages"] if s["is_active"]}),
                    "decision": _decision(registration["message"]),
                    "assignments": [
                        {
                            "event": e["event"],
                            "stage": e["stage"],
                            "at": e["timestamp"].isoformat(),
                            "why": e["message"],
                        }
                        for e in history
                        if e["version"] == entry["version"] and e["event"] in ("assignment", "unassignment")
                    ],
                }
            )
    return rows


def _decision(message: str) -> dict[str, Any] | str:
    """The gate's decision the registration tag's message holds; the message as it is when it holds none (a version
    registered by hand with `gto register -m ...`)."""
    try:
        decision = json.loads(message)
    except json.JSONDecodeError:
        return message
    required = {f.name for f in fields(Decision) if f.default is MISSING and f.default_factory is MISSING}
    return decision if isinstance(decision, dict) and required <= decision.keys() else message


def render(rows: list[dict[str, Any]]) -> str:
    """The registry as a table: a line per version, then its gate decision."""
    if not rows:
        return "no registered versions (run `alignflow retrain PIPELINE`)"
    lines = [f"{'model@version':<28}{'stages':<10}{'commit':<10}registered"]
    for row in rows:
        decision = row["decision"]
        lines.append(
            f"{row['model'] + '@' + row['version']:<28}{','.join(row['stages']) or '-':<10}{row['commit'][:8]:<10}"
            f"{row['registered']}"
        )
        if isinstance(decision, dict):
            verdict = "promoted" if decision["promoted"] else "rejected"
            lines.append(f"    gate: {verdict}: {decision['reason']}; remote: {decision.get('push', 'not pushed')}")
            if decision.get("quarantined"):
                lines.append(f"    quarantined: {', '.join(decision['quarantined'])}")
        else:
            lines.append(f"    gate: none recorded (registered by hand: {decision!r})")
        for assignment in row["assignments"]:
            arrow = "->" if assignment["event"] == "assignment" else "left"
            lines.append(f"    {assignment['at']} {arrow} {assignment['stage']}: {assignment['why']}")
    return "\n".join(lines)
