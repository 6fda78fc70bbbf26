"""Run a DVC pipeline's stages on Ray, keeping DVC the record of what ran.

The DAG, each stage's command and whether it is up to date all come from DVC's
own index (``dvc.yaml`` + ``dvc.lock``): there is no second copy of the pipeline.
A stage that is out of date runs its ``cmd`` on a Ray worker with the resources
params give its kind; when it succeeds, ``dvc commit`` records it in ``dvc.lock``
exactly as ``dvc repro`` would. Only paths cross process boundaries.

Independent stages run at the same time (Ray places them within the resources
they reserve); DVC's bookkeeping runs one call at a time (``flows.dag.open_repo``).
"""

import ctypes
import functools
import os
import select
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import ray
from dvc.dependency.param import ParamsDependency
from dvc.repo import Repo
from dvc.stage import PipelineStage
from dvc.stage.exceptions import StageNotFound

from flows.dag import dependencies_first, open_repo
from tasks.common.config import RunnerConfig, StageResources

LOGS = Path(".alignflow") / "logs"
# Set when the flow is interrupted (Ctrl-C, or Prefect cancelling the run): every stage waiting on
# Ray cancels its task, which kills the stage's process.
_INTERRUPTED = threading.Event()
_PR_SET_PDEATHSIG = 1
_CANCEL_GRACE_SECONDS = 10
_CANCEL_CHECK_SECONDS = 0.5
CANCEL_SECONDS = _CANCEL_GRACE_SECONDS + 20  # how long an interrupted stage can take to stop, at most


@dataclass(frozen=True)
class StageSpec:
    name: str
    cmd: str
    upstream: tuple[str, ...]
    params: tuple[str, ...]  # the params.yaml keys dvc.yaml lists for it: sections (sft) or keys (eval.batch_size)
    outs: tuple[str, ...]  # what it writes, metrics included, relative to the project


def read_dag(project: Path, targets: tuple[str, ...]) -> list[StageSpec]:
    """The stages ``targets`` need (themselves and everything upstream), in dependency order."""
    with open_repo(project) as repo:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        # Shards `dvc add`ed under data/ are stages of the graph too (a .dvc file each), with nothing to run.
        by_name = {stage.name: stage for stage in graph if isinstance(stage, PipelineStage)}
        finals = [by_name[stage.name] for target in targets for stage in _collect(repo, project, target)]
        needed = set().union(*({final, *nx.descendants(graph, final)} for final in finals))
        return [
            StageSpec(
                stage.name,
                stage.cmd if isinstance(stage.cmd, str) else " && ".join(stage.cmd),
                tuple(d.name for d in graph.successors(stage) if isinstance(d, PipelineStage)),
                tuple(
                    key
                    for dependency in stage.deps
                    if isinstance(dependency, ParamsDependency)
                    and dependency.def_path == ParamsDependency.DEFAULT_PARAMS_FILE
                    for key in dependency.params
                ),
                tuple(out.def_path for out in stage.outs),
            )
            for stage in dependencies_first(repo)
            if stage in needed and isinstance(stage, PipelineStage)
        ]


def _collect(repo: Repo, project: Path, target: str) -> list:
    """The stages a target names: one stage, or every stage of a foreach group (``eval_grpo_final``)."""
    try:
        return repo.stage.collect(_target(project, target))
    except StageNotFound:
        raise ValueError(f"{project / 'dvc.yaml'}: no stage {target!r}") from None


def _target(project: Path, stage: str) -> str:
    # DVC resolves a bare stage name against the current directory; name the dvc.yaml explicitly.
    return f"{project / 'dvc.yaml'}:{stage}"


def is_up_to_date(project: Path, stage: str) -> bool:
    with open_repo(project) as repo:
        return not repo.status(targets=[_target(project, stage)])


def record(project: Path, stage: str) -> dict[str, str]:
    """``dvc commit`` the stage (hash outputs, cache them, write dvc.lock); return {output: md5}."""
    with open_repo(project) as repo:
        (committed,) = repo.commit(_target(project, stage), force=True)
        return {out.def_path: out.hash_info.value for out in committed.outs}


def outputs(project: Path, stage: str) -> dict[str, str]:
    """{output: md5} of an up-to-date stage, as dvc.lock records them."""
    with open_repo(project) as repo:
        (found,) = repo.stage.collect(_target(project, stage))
        return {out.def_path: out.hash_info.value for out in found.outs}


def resources_for(stage: str, runner: RunnerConfig) -> StageResources:
    kind = stage.partition("@")[0]
    return runner.resources.get(kind, runner.resources["default"])


def _prepare_stage_process(niceness: int) -> None:
    """Runs in the stage's process before it starts: die with the Ray worker (a cancelled run, Ctrl-C), and
    run at the flow's priority rather than the worker's (a cluster may run workers niced)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except PermissionError:
        pass  # raising priority needs CAP_SYS_NICE; the stage then runs at the worker's priority


def _argv(cmd: str) -> list[str]:
    """A simple command runs as itself (so the parent-death signal reaches it); anything else under sh."""
    if any(char in cmd for char in "|&;<>()$`\\\"'*?[#~=%\n"):
        return ["/bin/sh", "-c", cmd]
    return shlex.split(cmd)


@ray.remote(max_retries=0)
def _execute(cmd: str, cwd: str, env: dict[str, str], log_path: str, niceness: int) -> int:
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            _argv(cmd),
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=functools.partial(_prepare_stage_process, niceness),
        )
        try:
            # The kernel wakes this task when the stage exits (a pidfd), so the next stage starts at once; the
            # timeout lets Ray's cancel interrupt it between waits. (Popen.wait(timeout) polls every few
            # milliseconds instead, which costs the stage CPU.)
            exited = os.pidfd_open(process.pid)
            try:
                while process.poll() is None:
                    select.select([exited], [], [], _CANCEL_CHECK_SECONDS)
            finally:
                os.close(exited)
            return process.returncode
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


class StageFailed(RuntimeError):
    pass


def start_run() -> None:
    _INTERRUPTED.clear()


def interrupt_run() -> None:
    """Stop the stages this process is running on Ray."""
    _INTERRUPTED.set()


def execute(project: Path, stage: StageSpec, runner: RunnerConfig, on_line: Callable[[str], None]) -> None:
    """Run ``stage.cmd`` on Ray in ``project``, forwarding its output line by line; StageFailed if it fails.

    The stage gets this process's environment, not the Ray worker's: Ray sets thread counts per
    worker, and a stage must compute with the same threads (so the same bits) as under ``dvc repro``.
    """
    resources = resources_for(stage.name, runner)
    log_path = project / LOGS / f"{stage.name.replace('@', '-')}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    reference = _execute.options(
        num_cpus=resources.num_cpus,
        num_gpus=resources.num_gpus,
        memory=int(resources.memory_gb * 2**30) or None,
    ).remote(stage.cmd, str(project), dict(os.environ), str(log_path), os.getpriority(os.PRIO_PROCESS, 0))
    try:
        with open(log_path, "rb") as log:
            tail = _LogTail(log, on_line)
            while not ray.wait([reference], timeout=0.5)[0]:
                tail.forward()
                if _INTERRUPTED.is_set():
                    raise StageFailed(f"stage {stage.name!r} interrupted")
            tail.forward(final=True)
            exit_code = ray.get(reference)
    except BaseException:
        _cancel(reference)
        raise
    if exit_code != 0:
        raise StageFailed(f"stage {stage.name!r} exited with status {exit_code} (log: {log_path})")


def execute_and_record(
    project: Path, stage: StageSpec, runner: RunnerConfig, on_line: Callable[[str], None]
) -> dict[str, str]:
    """``execute`` the stage, then ``record`` it; return {output: md5}.

    A stage's outputs land together, as its last act (``tasks.common.artifacts.landing_together``): one interrupted
    after they landed is recorded all the same before its StageFailed goes on, since they are what the run's params
    made, and a cancelled run puts params.yaml back; dvc.lock then says so, and the next run reruns the stage
    instead of taking its outputs for those of the params put back.
    """
    before = _landmarks(project, stage.outs)
    try:
        execute(project, stage, runner, on_line)
    except StageFailed:
        after = _landmarks(project, stage.outs)
        landed = bool(stage.outs) and all(new not in (None, old) for old, new in zip(before, after, strict=True))
        if landed and _INTERRUPTED.is_set():
            on_line(f"{stage.name} was interrupted after its outputs landed: recording them in dvc.lock")
            record(project, stage.name)
        raise
    return record(project, stage.name)


def _landmarks(project: Path, paths: tuple[str, ...]) -> list[tuple[int, int] | None]:
    """(inode, mtime) of each path, None where there is none: an output lands by a rename, which changes both."""
    found = []
    for path in paths:
        try:
            status = (project / path).stat()
        except FileNotFoundError:
            found.append(None)
        else:
            found.append((status.st_ino, status.st_mtime_ns))
    return found


def _cancel(reference: ray.ObjectRef) -> None:
    """Interrupt the task (its cleanup kills the stage's process group); kill the worker if that stalls."""
    ray.cancel(reference)
    if not ray.wait([reference], timeout=_CANCEL_GRACE_SECONDS)[0]:
        ray.cancel(reference, force=True)


class _LogTail:
    """Forwards complete lines appended to a log; a progress bar's redraws (carriage returns) collapse
    to their last state."""

    def __init__(self, log, on_line: Callable[[str], None]):
        self.log, self.on_line, self.partial = log, on_line, ""

    def forward(self, final: bool = False) -> None:
        text = self.partial + self.log.read().decode(errors="replace")
        lines = text.split("\n")
        self.partial = "" if final else lines.pop()
        for raw in lines:
            line = raw.rsplit("\r", 1)[-1].strip()
            if line:
                self.on_line(line)
