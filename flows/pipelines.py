"""Prefect flows, one per pipeline of the catalog, each running its part of dvc.yaml on Ray.

A flow's one parameter is its pipeline's run form (``flows/overrides.py``), built
when the pipeline's form or flow is first used (not when this module is imported),
from the working directory's params.yaml, read once on that first use. A flow
run: the form's values that differ from params.yaml become overrides -> validate
them with the CLI's rules -> write them into params.yaml (as ``dvc exp run -S``
does, so dvc.lock records the values used) ->
run every stage the pipeline needs as a Prefect task, in dependency order,
skipping those DVC reports up to date -> publish the pipeline report.

Runs of one project are queued: a file lock admits one run at a time, so two
runs triggered together never interleave writes to params.yaml, outputs or dvc.lock.
"""

import functools
import json
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock, Timeout
from prefect import Flow, flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.exceptions import TerminationSignal
from prefect.futures import PrefectFuture, wait
from pydantic import BaseModel

from flows import warm_runner
from flows.overrides import changed_overrides, dag_project, form_model
from flows.remote import push
from flows.report import collect, markdown_table, stage_metrics
from flows.runner import (
    CANCEL_SECONDS,
    StageSpec,
    execute_and_record,
    interrupt_run,
    is_up_to_date,
    outputs,
    read_dag,
    start_run,
)
from tasks.common.artifacts import CURVE_FILE, EPISODES_FILE, metrics_dir, stage_dir
from tasks.common.cluster import connect_ray, release_ray
from tasks.common.config import Params, RunnerConfig
from tasks.common.trackers import pipeline_run
from tasks.params.load import load_params
from tasks.params.write import restore, write_overrides
from tasks.pipelines import PIPELINES

RUN_LOCK = Path(".alignflow") / "run.lock"
T = TypeVar("T")


def run_lock(project: Path) -> FileLock:
    """The project's one-run-at-a-time lock; re-entrant on a thread, so a retrain holds it across its pipeline run,
    gate and registration."""
    (project / RUN_LOCK).parent.mkdir(parents=True, exist_ok=True)
    return FileLock(project / RUN_LOCK, is_singleton=True)


_POLL_SECONDS = 0.5


class RunCancelled(TerminationSignal):
    """The flow run was cancelled from another thread of its process (``cancel_run``), as ``alignflow serve``,
    which executes every run in its own process, cancels one: Prefect's engine takes it as the SIGTERM a runner
    sends a run's own process."""

    def __init__(self) -> None:
        super().__init__(signal.SIGTERM)


# Set by cancel_run until reset_cancel: a new stage (start_run) does not clear it, as it clears the interrupt.
_CANCELLED = threading.Event()


def cancel_run() -> None:
    """Cancel the flow run this process executes: its stages stop at once (their Ray tasks are cancelled), and the
    flow raises RunCancelled where it next waits, for a stage or for the run lock."""
    _CANCELLED.set()
    interrupt_run()


def reset_cancel() -> None:
    """Before the next flow run of a process that executes one after another."""
    _CANCELLED.clear()


def check_cancelled() -> None:
    if _CANCELLED.is_set():
        raise RunCancelled()


@contextmanager
def holding(lock: FileLock) -> Iterator[None]:
    """``with lock``, waiting in short polls so that a run cancelled while queued stops waiting."""
    while True:
        try:
            lock.acquire(timeout=_POLL_SECONDS)
            break
        except Timeout:
            check_cancelled()
    try:
        yield
    finally:
        lock.release()


@task(task_run_name="{stage.name}")
def run_stage(project: Path, stage: StageSpec, runner: RunnerConfig) -> dict[str, Any]:
    """Run one DVC stage on Ray unless it is up to date, record it in dvc.lock, publish its summary."""
    logger = get_run_logger()
    ran = not is_up_to_date(project, stage.name)
    if ran:
        logger.info(f"running {stage.name}: {stage.cmd}")
        # A stage flags trouble (KL running away, reward hacking, ...) with lines starting "WARNING".
        produced = execute_and_record(
            project, stage, runner, lambda line: (logger.warning if line.startswith("WARNING") else logger.info)(line)
        )
    else:
        logger.info(f"{stage.name} is up to date: skipped")
        produced = outputs(project, stage.name)
    metrics = stage_metrics(project, stage.name)
    curve = project / metrics_dir(stage.name) / CURVE_FILE
    episodes = project / stage_dir(stage.name) / EPISODES_FILE
    # the last ones: an RL stage's come from its final iterations
    shown = [json.loads(line) for line in episodes.read_text().splitlines()[-_EPISODES:]] if episodes.is_file() else []
    create_markdown_artifact(
        key=stage.name.replace("@", "-").replace("_", "-").lower(),
        markdown=stage_summary(
            stage.name, ran, metrics, produced, curve.read_text() if curve.is_file() else None, shown
        ),
        description=f"{stage.name}: metrics and outputs",
    )
    return {"stage": stage.name, "ran": ran, "outputs": produced, "metrics": metrics}


# Rows of a gold-vs-proxy curve a stage summary shows: an RL run's has one per iteration.
_CURVE_ROWS = 20
_EPISODES = 3  # an agent task's episodes a stage summary shows as conversations


def stage_summary(
    name: str,
    ran: bool,
    metrics: dict[str, Any],
    produced: dict[str, str],
    curve: str | None = None,
    episodes: list[dict[str, Any]] = (),
) -> str:
    """The stage's metrics, its gold-vs-proxy curve (the TSV's text, when it writes one), a few of its episodes as
    conversations (an agent task's eval and RL stages write them) and its outputs."""
    lines = [f"# {name} ({'ran' if ran else 'up to date, skipped'})", ""]
    if metrics:
        lines += ["| metric | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in metrics.items()), ""]
    if curve:
        header, *rows = [line.split("\t") for line in curve.splitlines()]
        shown = rows[:: max(1, -(-len(rows) // _CURVE_ROWS))]
        shown += [] if shown[-1] is rows[-1] else [rows[-1]]  # the run's end, where a stride would skip it
        lines += ["Gold and proxy reward against sqrt(KL) (Gao et al., 2022):", ""]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in shown] + [""]
    for episode in episodes:
        verdict = "correct" if episode["correct"] else "wrong"
        lines += [f"Episode: {_cell(episode['prompt'])} ({verdict}, {episode['turns']} turns)", ""]
        lines += ["| role | said |", "|---|---|"]
        lines += [f"| {turn['role']} | {_cell(turn['content'])} |" for turn in episode["messages"]] + [""]
    lines += ["| output | DVC md5 |", "|---|---|", *(f"| `{path}` | `{md5}` |" for path, md5 in produced.items())]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """``text`` as one markdown table cell: code, its pipes escaped, its lines kept."""
    return "`" + text.replace("`", "'").replace("|", "\\|").replace("\n", "` <br> `") + "`"


def result_or_interrupt(future: PrefectFuture) -> Any:
    """``future.result()``, waiting in short polls: Ctrl-C reaches a blocked main thread only when the kernel
    delivers SIGINT to that thread, and with Prefect's and Ray's threads around it may pick another; and a run
    cancelled from another thread (``cancel_run``) stops waiting."""
    while not future.wrapped_future.done():
        check_cancelled()
        future.wait(timeout=_POLL_SECONDS)
    check_cancelled()  # a stage the cancel interrupted failed: the run was cancelled, not failed
    return future.result()


@contextmanager
def overrides_written(params_file: Path, overrides: list[str]) -> Iterator[None]:
    """``write_overrides`` for the block; a run cancelled inside it (Ctrl-C, the UI, a stopped serve) leaves
    params.yaml's bytes as they were before it (a run that fails keeps them, as a stage run does)."""
    before = params_file.read_bytes()
    if overrides:
        write_overrides(params_file, overrides)
    try:
        yield
    except (KeyboardInterrupt, TerminationSignal):
        if overrides:
            restore(params_file, before)
        raise


def run_pipeline(name: str, overrides: list[str], project: Path, push_after: bool = True) -> dict[str, dict[str, Any]]:
    """Run pipeline ``name`` in ``project`` with dotlist ``overrides``, then push what it produced to the remote
    (unless ``push_after`` is false or params say not to); return the pipeline report."""
    logger = get_run_logger()
    params = load_params(project / "params.yaml", overrides, runs=[name])  # the CLI's validation, before anything runs
    with (
        run_lock(project),
        overrides_written(project / "params.yaml", overrides),
        pipeline_run(name, params.tracking),  # the stages' MLflow parent run and TensorBoard folder
    ):
        if overrides:
            logger.info(f"params.yaml updated with {', '.join(overrides)}")
        connect_ray(params.runner)
        check_cancelled()
        start_run()
        stage_task = run_stage.with_options(
            retries=params.runner.retries, retry_delay_seconds=params.runner.retry_delay_seconds
        )
        futures: dict[str, PrefectFuture] = {}
        # The stages on this machine fork from a warm runner, as under `alignflow repro`; started once Ray has set
        # its variables, so that the stages' environment (this process's) is the runner's.
        with warm_runner.started():
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
        if push_after and params.remote.push:
            pushed, outcome = push(project, params.remote)
            (logger.info if pushed else logger.error)(outcome)
    create_markdown_artifact(
        key=f"{name.replace('_', '-')}-report", markdown=markdown_table(report), description=f"{name} pipeline report"
    )
    return report


def form_flow(
    module: str, attribute: str, name: str, description: str, form: type[BaseModel], body: Callable[..., Any]
) -> Flow:
    """A Prefect flow whose one parameter, ``params``, is a pipeline's run ``form``; it calls ``body(overrides,
    project)`` with the fields that differ from params.yaml, under the run lock. Deployments load it by module path,
    so it must be ``module``'s attribute ``attribute``."""
    current = form()  # every field at the value params.yaml held when the form was built

    def run(params: BaseModel = current) -> Any:
        project = Path.cwd()
        # Compared under the run lock: a run queued behind another compares with the params.yaml that one left.
        with holding(run_lock(project)):
            return body(changed_overrides(params, load_params(project / "params.yaml", runs=())), project)

    run.__annotations__["params"] = form  # Prefect's form, and its validation of a run's parameters, read the type
    run.__name__ = run.__qualname__ = attribute
    run.__module__ = module
    return flow(run, name=name, description=description, validate_parameters=True)


def pipeline_flow(name: str, form: type[BaseModel]) -> Flow:
    """The Prefect flow of pipeline ``name`` (module attribute ``flows.pipelines.<name>``)."""
    return form_flow(__name__, name, name, PIPELINES[name].description, form, functools.partial(run_pipeline, name))


@functools.cache
def _project() -> tuple[Params, Path]:
    """The params the forms default to, and the project whose dvc.yaml says which each pipeline reads: the working
    directory's (`alignflow run` and `serve`, and a served run, start in the project), else the dataclass defaults
    and this source tree's dvc.yaml. Read once, when the first form is built (never on import), so that every form
    defaults to the same params.yaml."""
    here = Path.cwd()
    # the forms' defaults: each run validates its own pipeline (run_pipeline), not every pipeline's rules
    params = load_params(here / "params.yaml", runs=()) if (here / "params.yaml").is_file() else Params()
    return params, dag_project(here)


class PerPipeline(Mapping[str, T]):
    """Something of every pipeline, built on first use: `alignflow run` needs one pipeline's form and flow (all six
    take a second and a half to build, a sixth of what Prefect adds to a run), `alignflow serve` every one."""

    def __init__(self, build: Callable[[str], T]):
        self._build, self._built = build, {}

    def __getitem__(self, name: str) -> T:
        if name not in PIPELINES:
            raise KeyError(name)
        if name not in self._built:
            self._built[name] = self._build(name)
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(PIPELINES)

    def __len__(self) -> int:
        return len(PIPELINES)


FORMS: PerPipeline[type[BaseModel]] = PerPipeline(lambda name: form_model(name, *_project()))
FLOWS: PerPipeline[Flow] = PerPipeline(lambda name: pipeline_flow(name, FORMS[name]))


def __getattr__(attribute: str) -> Flow:
    """``flows.pipelines.<pipeline>``: the module path a deployment loads its flow by."""
    if attribute in PIPELINES:
        return FLOWS[attribute]
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
