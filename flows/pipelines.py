"""Prefect flows, one per pipeline of the catalog, each running its part of dvc.yaml on Ray.

A flow run: validate the overrides with the CLI's rules -> write them into
params.yaml (as ``dvc exp run -S`` does, so dvc.lock records the values used) ->
run every stage the pipeline needs as a Prefect task, in dependency order,
skipping those DVC reports up to date -> publish the pipeline report.

Runs of one project are queued: a file lock admits one run at a time, so two
runs triggered together never interleave writes to params.yaml, outputs or dvc.lock.
"""

import shutil
from pathlib import Path
from typing import Any

from dvc.utils.hydra import apply_overrides
from filelock import FileLock
from prefect import Flow, flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.futures import PrefectFuture, wait

from flows.catalog import PIPELINES
from flows.overrides import Overrides, to_dotlist
from flows.report import collect, markdown_table, stage_metrics
from flows.runner import (
    CANCEL_SECONDS,
    StageSpec,
    execute,
    interrupt_run,
    is_up_to_date,
    outputs,
    read_dag,
    record,
    start_run,
)
from tasks.common.artifacts import atomic_output
from tasks.common.cluster import connect_ray, release_ray
from tasks.common.config import RunnerConfig
from tasks.common.params import load_params

RUN_LOCK = Path(".alignflow") / "run.lock"
_POLL_SECONDS = 0.5


@task(task_run_name="{stage.name}")
def run_stage(project: Path, stage: StageSpec, runner: RunnerConfig) -> dict[str, Any]:
    """Run one DVC stage on Ray unless it is up to date, record it in dvc.lock, publish its summary."""
    logger = get_run_logger()
    ran = not is_up_to_date(project, stage.name)
    if ran:
        logger.info(f"running {stage.name}: {stage.cmd}")
        # A stage flags trouble (KL running away, reward hacking, ...) with lines starting "WARNING".
        execute(
            project, stage, runner, lambda line: (logger.warning if line.startswith("WARNING") else logger.info)(line)
        )
        produced = record(project, stage.name)
    else:
        logger.info(f"{stage.name} is up to date: skipped")
        produced = outputs(project, stage.name)
    metrics = stage_metrics(project, stage.name)
    create_markdown_artifact(
        key=stage.name.replace("@", "-").replace("_", "-").lower(),
        markdown=_stage_summary(stage.name, ran, metrics, produced),
        description=f"{stage.name}: metrics and outputs",
    )
    return {"stage": stage.name, "ran": ran, "outputs": produced, "metrics": metrics}


def _stage_summary(name: str, ran: bool, metrics: dict[str, Any], produced: dict[str, str]) -> str:
    lines = [f"# {name} ({'ran' if ran else 'up to date, skipped'})", ""]
    if metrics:
        lines += ["| metric | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in metrics.items()), ""]
    lines += ["| output | DVC md5 |", "|---|---|", *(f"| `{path}` | `{md5}` |" for path, md5 in produced.items())]
    return "\n".join(lines)


def result_or_interrupt(future: PrefectFuture) -> Any:
    """``future.result()``, waiting in short polls: Ctrl-C reaches a blocked main thread only when the kernel
    delivers SIGINT to that thread, and with Prefect's and Ray's threads around it may pick another."""
    while not future.wrapped_future.done():
        future.wait(timeout=_POLL_SECONDS)
    return future.result()


def write_overrides(params_file: Path, overrides: list[str]) -> None:
    """Set ``overrides`` in params.yaml keeping its comments (DVC's own `exp run -S` editor), atomically."""
    with atomic_output(params_file) as temporary:
        shutil.copyfile(params_file, temporary)
        apply_overrides(temporary, overrides)


def run_pipeline(name: str, overrides: list[str], project: Path) -> dict[str, dict[str, Any]]:
    """Run pipeline ``name`` in ``project`` with dotlist ``overrides``; return the pipeline report."""
    logger = get_run_logger()
    params = load_params(project / "params.yaml", overrides)  # the CLI's validation, before anything runs
    (project / RUN_LOCK).parent.mkdir(parents=True, exist_ok=True)
    with FileLock(project / RUN_LOCK):
        if overrides:
            write_overrides(project / "params.yaml", overrides)
            logger.info(f"params.yaml updated with {', '.join(overrides)}")
        connect_ray(params.runner)
        start_run()
        stage_task = run_stage.with_options(
            retries=params.runner.retries, retry_delay_seconds=params.runner.retry_delay_seconds
        )
        futures: dict[str, PrefectFuture] = {}
        for stage in read_dag(project, PIPELINES[name].stages(params)):
            upstream = [futures[u] for u in stage.upstream if u in futures]
            futures[stage.name] = stage_task.submit(project, stage, params.runner, wait_for=upstream)
        try:
            for future in futures.values():
                result_or_interrupt(future)
        except BaseException:
            interrupt_run()
            wait(list(futures.values()), timeout=CANCEL_SECONDS)  # the stages stop their Ray work
            raise
        finally:
            release_ray()
        report = collect(project)
    create_markdown_artifact(
        key=f"{name.replace('_', '-')}-report", markdown=markdown_table(report), description=f"{name} pipeline report"
    )
    return report


def pipeline_flow(name: str) -> Flow:
    """The Prefect flow of pipeline ``name``: its one parameter is the typed ``Overrides`` form."""

    def run(overrides: Overrides | None = None) -> dict[str, dict[str, Any]]:
        return run_pipeline(name, to_dotlist(overrides), Path.cwd())

    # Deployments load a flow by module path (flows.pipelines.<name>), so each is a module attribute of its name.
    run.__name__ = run.__qualname__ = name
    return flow(run, name=name, description=PIPELINES[name].description, validate_parameters=True)


FLOWS: dict[str, Flow] = {name: pipeline_flow(name) for name in PIPELINES}
globals().update(FLOWS)
