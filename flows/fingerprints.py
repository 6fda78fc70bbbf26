"""The fingerprint files dvc.yaml lists in place of what params name by a name alone (a model source, a task module
of your own), written from their content by the ``sources`` stage (``alignflow fingerprints``). DVC runs that stage
first on every repro (``always_changed``); a fingerprint whose source did not change keeps its bytes, so nothing
downstream re-runs, and plain ``dvc repro`` re-runs what a changed source feeds as ``alignflow repro`` does (plain
``dvc status`` lists ``sources`` as always changed: DVC learns what changed only by running it).

DVC sees a task only through params (``task.name``, ``agent_data.task``): an edited generator, verifier or environment
under the same name would leave every stage "up to date", or restore stale outputs from DVC's run cache. Its digest
goes to ``sources/<section>.task.sha256``, which the data stage and the stages that read its data list. A built-in
task's code is already those stages' own code dependency.
"""

import functools
import hashlib
from pathlib import Path
from typing import Any

from models.sources import source_digest, write_fingerprint
from tasks.data.problems import BUILT_IN, task_module
from tasks.kinds import stage_kinds

TASK_FINGERPRINT_HEADER = (
    "# The task module's source by content, written by dvc.yaml's `sources` stage, which every `dvc repro`\n"
    "# runs first: dvc.yaml lists this file, so an edited generator, verifier or environment re-runs the\n"
    "# stages that use it (docs/tasks.md). Commit it with dvc.lock."
)
SOURCES_STAGE = "sources"


def fingerprinted() -> list[tuple[str, str]]:
    """(fingerprint file, the params key it stands for) of every model source and task module a stage reads."""
    kinds = stage_kinds().values()
    sources = [(kind.fingerprint, f"{kind.section}.{kind.source}") for kind in kinds if kind.source is not None]
    return sources + [(kind.task_fingerprint, kind.task_key) for kind in kinds if kind.task_key is not None]


def refresh_fingerprints(params: Any, project: Path) -> None:
    """Write the sha256 of each model source and task module ``params`` name to its fingerprint file in ``project``
    (the ``sources`` stage's command), so that DVC compares their content with what dvc.lock recorded."""
    for kind in stage_kinds().values():
        if kind.source is not None:
            spec = getattr(getattr(params, kind.section), kind.source)
            write_fingerprint(project / kind.fingerprint, None if spec is None else source_digest(spec))
        if kind.task_key is not None:
            name = functools.reduce(getattr, kind.task_key.split("."), params)
            digest = task_source_digest(name)
            write_fingerprint(project / kind.task_fingerprint, digest, TASK_FINGERPRINT_HEADER, "a built-in task")


def task_source_digest(name: str) -> str | None:
    """The sha256 of task ``name``'s own source: its module file, or every ``.py`` file of its package (by relative
    path, in name order); None for a built-in task."""
    if name in BUILT_IN:
        return None
    path = Path(task_module(name).__file__)
    root = path.parent if path.name == "__init__.py" else path
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(root.parent)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()
