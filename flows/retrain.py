"""`alignflow retrain PIPELINE`: new data in, a candidate trained, gated against the champion, registered.

One retrain, holding the project's run lock throughout:

1. every shard the pipeline's data stages read (``data.train_file`` / ``test_file``, or ``agent_data``'s) passes
   those stages' own checks (a bad row stops everything before any work, naming ``file:line``), and each new one
   is versioned with ``dvc add``;
2. the pipeline runs on Ray as ``alignflow run`` does (only what the new data or params made stale);
3. the candidate is saved as a DVC experiment (``dvc exp save``: a commit holding its dvc.lock, params and
   shards' .dvc files, listed by ``dvc exp show`` with its metrics, while the branch stays where it was: a
   candidate is a result to compare, not a change to the code's history) and pushed to the remote;
4. the gate scores candidate and champion (the model in ``prod``) on the same held-out split; the candidate is
   registered as the next version with the decision and its numbers as the tag's message, and promoted to
   ``prod`` only if the gate says so;
5. a rejected candidate's new shards move to ``retrain.quarantine``, so the next candidate trains without them; so
   do new shards the data stage would refuse (step 1), before anything is versioned or trained.

A run that fails at any step before registration registers nothing and leaves ``prod`` where it was.
"""

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from prefect import Flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel

from flows.dag import open_repo
from flows.gate import decide, evaluated, score_at
from flows.lineage import shards_at
from flows.pipelines import FORMS, PerPipeline, form_flow, run_lock, run_pipeline
from flows.registry import Decision, artifact_name, assign_prod, check_artifact_path, prod_version, register
from flows.remote import push
from flows.runner import read_dag
from tasks.common.config import Params
from tasks.data.datasets import shard_files
from tasks.kinds import problem_kinds, stage_kinds
from tasks.params.load import load_params
from tasks.pipelines import PIPELINES, kinds_run
from tasks.stages.data import splits


def data_sections(pipeline: str, params: Params) -> list[str]:
    """The params sections (data, agent_data) whose problems ``pipeline``'s data stages read."""
    run = kinds_run([pipeline], params)
    return [stage_kinds()[kind].section for kind in problem_kinds() if kind in run]


def check_shards(project: Path, params: Params, sections: list[str]) -> list[str]:
    """Every shard of your own that the params ``sections`` name, after the data stages' own checks on them and the
    splits they make. New (unversioned) shards a data stage would refuse (a bad row, a held-out problem in the
    training split, a worked trace the task does not replay) are moved to ``retrain.quarantine``, so the next
    retrain runs without them, and the refusal is raised."""
    configs = [getattr(params, section) for section in sections]
    sources = [source for cfg in configs for source in (cfg.train_file, cfg.test_file) if source is not None]
    shards = sorted({str(f.relative_to(project)) for s in sources for f in shard_files(project / s)})
    try:
        with _working_in(project):
            for section in sections:  # DatasetError naming file:line; ValueError naming a prompt in both splits
                splits(params, section)
    except ValueError as refusal:
        new = _unversioned(project, shards)
        if not new or params.retrain.quarantine is None:
            raise
        moved = _set_aside(project, new, params.retrain.quarantine)
        raise ValueError(f"{refusal}; the new shard(s) moved to {', '.join(moved)}: fix and move them back") from None
    return shards


def track_shards(project: Path, params: Params, sections: list[str]) -> list[str]:
    """``check_shards``, then ``dvc add`` of the shards not yet versioned; every shard's path."""
    shards = check_shards(project, params, sections)
    if new := _unversioned(project, shards):
        with open_repo(project) as repo:
            repo.add([str(project / s) for s in new])
    return shards


def _unversioned(project: Path, shards: list[str]) -> list[str]:
    with open_repo(project) as repo:
        return [s for s in shards if not (project / f"{s}.dvc").exists() and not repo.scm.is_tracked(s)]


def _set_aside(project: Path, shards: list[str], where: str) -> list[str]:
    """Move unversioned ``shards`` into ``where``; their new paths."""
    (project / where).mkdir(parents=True, exist_ok=True)
    moved = [str(Path(where) / Path(shard).name) for shard in shards]
    for shard, target in zip(shards, moved, strict=True):
        (project / shard).rename(project / target)
    return moved


@contextlib.contextmanager
def _working_in(project: Path) -> Iterator[None]:
    """In ``project`` (params' data paths are relative to it), then back."""
    before = Path.cwd()
    os.chdir(project)
    try:
        yield
    finally:
        os.chdir(before)


def save_candidate(project: Path, pipeline: str, params: Params) -> str:
    """``dvc exp save`` of the workspace, every file git does not ignore included; the experiment's commit.

    Only the pipeline's own stages are committed: a project's other pipelines may never have run."""
    stages = [f"{project / 'dvc.yaml'}:{stage.name}" for stage in read_dag(project, PIPELINES[pipeline].stages(params))]
    with open_repo(project) as repo:
        untracked = list(repo.scm.untracked_files())
        return repo.experiments.save(
            targets=stages,
            name=f"{artifact_name(pipeline)}-candidate",
            include_untracked=untracked,
            force=True,
            message=f"alignflow retrain {pipeline}: candidate",
        )


def quarantine(project: Path, shards: list[str], where: str) -> list[str]:
    """Move ``shards`` (and their .dvc files) into ``where``; return their new paths."""
    (project / where).mkdir(parents=True, exist_ok=True)
    moved = []
    with open_repo(project) as repo:
        for shard in shards:
            target = str(Path(where) / Path(shard).name)
            repo.move(str(project / shard), str(project / target))
            moved.append(target)
    return moved


def retrain(pipeline: str, overrides: list[str], project: Path) -> Decision:
    """One retrain of ``pipeline`` in ``project`` (see the module's docstring); the gate's decision."""
    logger = get_run_logger()
    params = load_params(project / "params.yaml", overrides, runs=[pipeline])
    artifact, model = artifact_name(pipeline), check_artifact_path(project, pipeline, params)
    with run_lock(project):
        shards = track_shards(project, params, data_sections(pipeline, params))
        run_pipeline(pipeline, overrides, project, push_after=False)
        params = load_params(project / "params.yaml", runs=[pipeline])  # the overrides are in params.yaml now
        champion = prod_version(project, artifact)
        kind = PIPELINES[pipeline].delivers
        candidate_metrics = evaluated(project, PIPELINES[pipeline].model(params))
        champion_metrics = None if champion is None else score_at(project, champion[1], model, params, kind)
        promoted, why = decide(candidate_metrics, champion_metrics, params.retrain)
        known = set() if champion is None else set(shards_at(project, champion[1]))
        decision = Decision(
            promoted,
            why,
            candidate_metrics,
            champion_metrics,
            None if champion is None else champion[0],
            new_shards=[s for s in shards if s not in known],
        )
        commit = save_candidate(project, pipeline, params)
        if params.remote.push:
            pushed, decision.push = push(project, params.remote)
            (logger.info if pushed else logger.error)(decision.push)
        if not promoted and params.retrain.quarantine is not None and champion is not None and decision.new_shards:
            decision.quarantined = quarantine(project, decision.new_shards, params.retrain.quarantine)
            logger.warning(f"quarantined {', '.join(decision.quarantined)}: the next candidate trains without them")
        version = register(project, artifact, commit, decision)
        if promoted:
            assign_prod(project, artifact, version, f"gate: {why}")
    logger.info(f"{artifact}@{version}: {'promoted to prod' if promoted else 'rejected'} ({why})")
    create_markdown_artifact(
        key=f"{artifact}-gate", markdown=_markdown(artifact, version, decision), description=f"{artifact} gate"
    )
    return decision


def _markdown(artifact: str, version: str, decision: Decision) -> str:
    verdict = "promoted to `prod`" if decision.promoted else "rejected"
    lines = [f"# {artifact}@{version}: {verdict}", "", decision.reason, ""]
    champion = decision.champion or {}
    lines += ["| metric | candidate | champion |", "|---|---|---|"]
    lines += [f"| {k} | {v:.4f} | {champion.get(k, float('nan')):.4f} |" for k, v in decision.candidate.items()]
    lines += ["", f"champion: {decision.champion_version or 'none'}; new shards: {', '.join(decision.new_shards)}"]
    lines += [f"quarantined: {', '.join(decision.quarantined) or 'none'}; remote: {decision.push}"]
    return "\n".join(lines)


def _retrain_report(pipeline: str, overrides: list[str], project: Path) -> dict[str, Any]:
    return asdict(retrain(pipeline, overrides, project))


def retrain_flow(name: str, form: type[BaseModel]) -> Flow:
    """The Prefect flow retraining pipeline ``name`` (``flows.retrain.retrain_<name>``), with its run form."""
    description = f"Retrain {name} on the current data, gate it against the prod champion, register it."
    flow_name = f"retrain-{name.replace('_', '-')}"
    return form_flow(__name__, f"retrain_{name}", flow_name, description, form, partial(_retrain_report, name))


RETRAIN_FLOWS: PerPipeline[Flow] = PerPipeline(lambda name: retrain_flow(name, FORMS[name]))


def __getattr__(attribute: str) -> Flow:
    """``flows.retrain.retrain_<pipeline>``: the module path a deployment loads its flow by."""
    pipeline = attribute.removeprefix("retrain_")
    if attribute.startswith("retrain_") and pipeline in PIPELINES:
        return RETRAIN_FLOWS[pipeline]
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
