"""`alignflow serve`: per pipeline, a deployment to run it from the UI and one to retrain it on a schedule; every flow
run of them executes inside this one long-lived process.

Each deployment's parameter form is its pipeline's run form (``flows/overrides.py``); the server
rejects a run whose parameters do not match that schema before anything runs.

Prefect's own runner (``prefect.serve``) starts a new Python process for every flow run, which imports Prefect,
DVC, torch and the flows again and joins Ray again: seconds of every run. Here the flow runs execute in this
process, which imported all of them and joined Ray once, at start-up: on a thread of their own, one at a time, in
the order they became due (a deployment's ``concurrency_limit=1`` still queues its runs at the server, and the
flow's own lock queues runs started from the CLI in its own process). Runs arrive two ways:

- the deployments' scheduled runs (a cron of ``runner.schedules``, the UI's Run button, the API): polled from the
  server every ``POLL_SECONDS`` (the polls also keep the deployments READY, and notice a run cancelled in the UI);
- `alignflow run` in this project (``flows/submit.py``): over a local socket, at once. This process creates the
  flow run from the pipeline's deployment (so it is in the UI like any other), executes it, and streams its log
  lines and report back; the client closing the connection (Ctrl-C) cancels it.

A run is cancelled as a runner cancels one: its stages' Ray tasks are cancelled at once (which kills their
processes), and the flow stops where it next waits, ending Cancelled; this process goes on to the next run.

SIGINT (Ctrl-C), SIGTERM or SIGHUP (its terminal closed) stops it with status 0: it cancels the run it is executing
and those submitted from the CLI that wait, pauses the deployments that have a schedule (so a stopped serve does not
pile up late runs), leaves Ray and exits. The pause needs the Prefect server, whose client retries for minutes when
the server is gone: once the server has not answered for ``STOP_SECONDS`` the pause is given up and the process
exits all the same.
"""

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
from prefect import Flow
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy, FlowRun
from prefect.deployments.runner import EntrypointType
from prefect.exceptions import Abort, TerminationSignal
from prefect.flow_engine import run_flow
from prefect.logging.formatters import PrefectFormatter
from prefect.settings import PREFECT_UI_URL
from prefect.states import Cancelled, Pending
from prefect.utilities.engine import propose_state_sync

from flows import submit, warm_runner
from flows.overrides import form_values
from flows.pipelines import FLOWS, FORMS, cancel_run, reset_cancel
from flows.prefect_internals import clear_intent, commit_cancel_intent
from flows.report import render
from flows.retrain import RETRAIN_FLOWS
from flows.runner import CANCEL_SECONDS
from tasks.common.cluster import connect_ray, hold_ray
from tasks.common.config import Params

STOP_SECONDS = 5.0  # the pause and Ray's shutdown, once no run executes, take about a second when the server answers
# How soon a run triggered from the UI, the API or a schedule starts, and a cancel from the UI takes effect. A poll
# costs the server a write (the deployments' last poll): polling every second took 2% of a core on this machine,
# idle, every 2 s 1%. (`alignflow run` does not wait for a poll.)
POLL_SECONDS = 2.0
# The console's format (Prefect's logging.yml), for the log lines a run streams to the `alignflow run` following it.
_FORMATS = {
    "format": "%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s",
    "flow_run_fmt": "%(asctime)s.%(msecs)03d | %(levelname)-7s | Flow run %(flow_run_name)r - %(message)s",
    "task_run_fmt": "%(asctime)s.%(msecs)03d | %(levelname)-7s | Task run %(task_run_name)r - %(message)s",
    "datefmt": "%H:%M:%S",
}
_log = logging.getLogger("alignflow.serve")


def _give_up() -> None:
    print(
        f"alignflow serve: the Prefect server did not answer within {STOP_SECONDS:g} s; exiting without pausing "
        "the deployments",
        file=sys.stderr,
        flush=True,
    )
    ray.shutdown()
    os._exit(0)  # the main thread is stuck in the client's retries: only leaving the process ends them


class _ServerDeadline:
    """Gives up (``_give_up``) once the Prefect server has not answered for STOP_SECONDS: a deadline per request,
    so a slow server that answers each pause in turn is waited for, and one that is gone is not."""

    def __init__(self) -> None:
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def arm(self, *, restart: bool = False) -> None:
        """Start the deadline; ``restart``: start it afresh (the server has just answered)."""
        with self._lock:
            if self._timer is not None and not restart:
                return
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(STOP_SECONDS, _give_up)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()


_deadline = _ServerDeadline()


_stopping = threading.Event()


def _interrupt(signum: int, frame: Any) -> None:
    if _stopping.is_set():  # stopping already (cancelling the run, pausing): a second signal hurries it
        _deadline.arm()
        return
    _stopping.set()
    raise KeyboardInterrupt


@dataclass(eq=False)
class _Job:
    """A flow run to execute, and the `alignflow run` following it, if one submitted it."""

    flow_run: FlowRun
    flow: Flow
    parameters: dict[str, Any] | None = None  # None: the flow run's own (a polled run)
    client: socket.socket | None = None
    pipeline: str | None = None
    cancelled: str | None = None
    done: bool = False

    def __post_init__(self) -> None:
        self.sending = threading.Lock()

    def tell(self, message: dict[str, Any]) -> None:
        with self.sending:
            if self.client is None:
                return
            try:
                submit.send(self.client, message)
            except OSError:
                self.client = None  # gone: the run goes on (its cancel comes from the connection's reader)

    def finish(self, message: dict[str, Any]) -> None:
        self.tell(message)
        with self.sending:
            if self.client is not None:
                try:
                    self.client.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        self.done = True  # last: the connection's reader closes it once the run is done


def _failure(error: BaseException) -> dict[str, Any]:
    """What a failed run tells its client: the error's family (``flows/submit.py``) and its message."""
    from tasks.common.config import ConfigError
    from tasks.common.errors import NonFiniteError
    from tasks.data.datasets import DatasetError

    for family in (ConfigError, DatasetError, NonFiniteError, ValueError):
        if isinstance(error, family):
            return {"failed": {"type": family.__name__, "message": str(error)}}
    return {"failed": {"type": type(error).__name__, "message": f"{type(error).__name__}: {error}"}}


class _ToClient(logging.Handler):
    """Sends the log lines of the run executing to the `alignflow run` following it, formatted as its console."""

    def __init__(self, current: Callable[[], "_Job | None"]):
        super().__init__()
        self.current = current
        console = [h.formatter for h in logging.getLogger().handlers if type(h).__name__ == "PrefectConsoleHandler"]
        self.setFormatter(console[0] if console and console[0] else PrefectFormatter(**_FORMATS))

    def emit(self, record: logging.LogRecord) -> None:
        job = self.current()
        if job is not None and job.client is not None and getattr(record, "flow_run_id", None) == str(job.flow_run.id):
            job.tell({"log": self.format(record)})


class InProcessRunner:
    """Executes the flow runs of its deployments in this process, one at a time (see the module's docstring)."""

    def __init__(self, project: Path, client: SyncPrefectClient):
        self.project, self.client = project, client
        self.api = threading.Lock()  # one request at a time on the shared client
        self.flows: dict[Any, tuple[str, Flow]] = {}  # deployment id -> (name, flow)
        self.deployment_ids: dict[str, Any] = {}  # deployment name -> id
        self.scheduled: list[Any] = []  # the deployments with a schedule, which a stop pauses
        self.queue: list[_Job] = []
        self.handled: set[Any] = set()  # flow runs taken off the queue, which a late poll may return still
        self.current: _Job | None = None
        self.changed = threading.Condition()
        self.listener: socket.socket | None = None
        self.polling = True

    def claim_project(self) -> None:
        """Take the project's socket name, before anything else: a second serve of a project is refused. (It takes
        runs, and `alignflow run` finds it, only once ``start`` listens.)"""
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(submit.address(self.project))
        except OSError:
            from tasks.common.config import ConfigError

            raise ConfigError(f"{self.project}: another alignflow serve serves this project already") from None

    def add(self, name: str, flow: Flow, deployment: Any) -> None:
        deployment_id = deployment.apply()
        self.flows[deployment_id], self.deployment_ids[name] = (name, flow), deployment_id
        if deployment.schedules:
            self.scheduled.append(deployment_id)

    # -- the process's threads

    def start(self) -> None:
        self.listener.listen()
        logging.getLogger("prefect").addHandler(_ToClient(lambda: self.current))
        threading.Thread(target=self._poll, name="alignflow-serve-poll", daemon=True).start()
        threading.Thread(target=self._listen, name="alignflow-serve-listen", daemon=True).start()

    def serve(self) -> None:
        """Execute the runs as they come, each on a thread of its own; until interrupted."""
        while True:
            job = self._next()
            executing = threading.Thread(
                target=self._execute, args=(job,), name=f"flow-run-{job.flow_run.name}", daemon=True
            )
            executing.start()
            while executing.is_alive():
                executing.join(0.5)  # short waits: a signal reaches the main thread between them
            with self.changed:
                self.current = None

    def stop(self) -> None:
        """Cancel the run executing (its stages stop within CANCEL_SECONDS), then the runs `alignflow run` submitted
        that wait, and pause the deployments that have a schedule."""
        self.polling = False  # a poll writes to the server's database, as a pause does: they would wait on each other
        if self.listener is not None:
            try:
                self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread waiting in accept
            except OSError:
                pass
            self.listener.close()
        with self.changed:
            waiting = [job for job in self.queue if job.client is not None]
            self.queue = [job for job in self.queue if job.client is None]  # the schedule's stay, for the next serve
            job = self.current
        if job is not None:
            self.cancel(job, "alignflow serve stopped")
            deadline = time.monotonic() + CANCEL_SECONDS
            while not job.done and time.monotonic() < deadline:
                time.sleep(0.1)
        _deadline.arm()
        for queued in waiting:
            self._cancel_queued(queued, "alignflow serve stopped")
            _deadline.arm(restart=True)
        for deployment_id in self.scheduled:  # a deployment without a schedule starts nothing on its own
            with self.api:
                self.client.pause_deployment(deployment_id)
            _deadline.arm(restart=True)

    def _next(self) -> _Job:
        with self.changed:
            while not self.queue:
                self.changed.wait(0.5)
            job = min(self.queue, key=lambda queued: queued.flow_run.expected_start_time or _now())
            self.queue.remove(job)
            self.handled.add(job.flow_run.id)
            self.current = job
            return job

    def _poll(self) -> None:
        """Take the deployments' due runs into the queue; notice the run executing cancelled in the UI."""
        ids = list(self.flows)
        while self.polling:
            try:
                with self.api:
                    runs = self.client.get_scheduled_flow_runs_for_deployments(ids, scheduled_before=_now())
                self._polled(runs)
                job = self.current
                if job is not None and job.cancelled is None:
                    with self.api:
                        state = self.client.read_flow_run(job.flow_run.id).state
                    if state is not None and state.is_cancelling():
                        self.cancel(job, "cancelled in Prefect")
            except Exception as error:  # noqa: BLE001 - the server may be restarting: poll again
                _log.warning(f"alignflow serve: polling the Prefect server failed: {error}")
            time.sleep(POLL_SECONDS)

    def _polled(self, runs: list[FlowRun]) -> None:
        with self.changed:
            due = {run.id for run in runs}
            known = {job.flow_run.id for job in self.queue}
            # a queued scheduled run the server no longer returns was cancelled, or taken by another runner
            self.queue = [job for job in self.queue if job.client is not None or job.flow_run.id in due]
            self.handled &= due | {job.flow_run.id for job in self.queue}
            for run in runs:
                if run.id not in known and run.id not in self.handled and run.deployment_id in self.flows:
                    self.queue.append(_Job(run, self.flows[run.deployment_id][1]))
            self.changed.notify_all()

    def _listen(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed: stopping
            threading.Thread(target=self._submitted, args=(connection,), daemon=True).start()

    # -- a run `alignflow run` submits

    def _submitted(self, connection: socket.socket) -> None:
        """Queue the run `alignflow run` asks for, then wait for the client to close its end: until the run is
        over, that cancels it."""
        with connection:
            if submit.peer(connection)[1] != os.getuid():
                return
            lines = submit.Lines(connection)
            try:
                request = lines.next()
            except (OSError, ValueError):
                return
            job = None if request is None else self._create(request, connection)
            if job is None:
                return
            try:
                while lines.next() is not None:
                    pass
            except (OSError, ValueError):
                pass
            if not job.done:
                self.cancel(job, "the alignflow run that submitted it was interrupted")
            while not job.done:  # the connection stays open for the run's last words
                time.sleep(0.1)

    def _create(self, request: dict[str, Any], connection: socket.socket) -> _Job | None:
        pipeline = request.get("run")
        job = _Job(None, None, client=connection, pipeline=pipeline)  # type: ignore[arg-type]
        try:
            job.flow, overrides = FLOWS[pipeline], request["overrides"]
            values = form_values(pipeline, FORMS[pipeline], overrides)  # the CLI's messages, before any run exists
            job.parameters = {"params": values}  # as validated (a null, which the form's JSON leaves out, included)
            # Created and queued at once, so that a poll cannot queue the new run a second time.
            with self.changed, self.api:
                job.flow_run = self.client.create_flow_run_from_deployment(
                    self.deployment_ids[pipeline],
                    # what the CLI set, no more: the rest is what params.yaml holds when the run starts
                    parameters={"params": values.model_dump(mode="json", exclude_unset=True)},
                )
                ahead = len(self.queue) + (self.current is not None)
                self.queue.append(job)
                self.changed.notify_all()
        except Exception as error:  # noqa: BLE001 - told to the client, which prints it as its own
            job.finish(_failure(error))
            return None
        url = PREFECT_UI_URL.value()
        job.tell({"log": _line(f"Created flow run {job.flow_run.name!r} for deployment {pipeline!r}")})
        if url:
            job.tell({"log": _line(f"View at {url}/runs/flow-run/{job.flow_run.id}")})
        if ahead:
            job.tell({"log": _line(f"Queued behind {ahead} run(s) of this alignflow serve (pid {os.getpid()})")})
        return job

    # -- executing and cancelling

    def _execute(self, job: _Job) -> None:
        """Claim the run (Pending), then run its flow here; tell its client how it ended."""
        try:
            if not self._claim(job):
                return
            reset_cancel()
            if job.cancelled is not None:  # cancelled between leaving the queue and here
                self._cancel_queued(job, job.cancelled)
                return
            result = run_flow(job.flow, flow_run=job.flow_run, parameters=job.parameters)
        except TerminationSignal:  # cancelled (RunCancelled), the engine has recorded it
            job.finish({"cancelled": job.cancelled or "cancelled"})
        except Exception as error:  # noqa: BLE001 - the flow run failed: the engine has recorded and logged it
            job.finish(_failure(error))
        else:
            job.finish({"done": render(result) if job.pipeline else str(result)})
        finally:
            clear_intent()
            job.done = True

    def _claim(self, job: _Job) -> bool:
        """Propose Pending, as a runner does before it starts a run: False (and the client told) if refused."""
        try:
            with self.api:
                state = propose_state_sync(self.client, Pending(), flow_run_id=job.flow_run.id)
                if state.is_pending():
                    self.client.update_flow_run(
                        job.flow_run.id, infrastructure_pid=f"{socket.gethostname()}:{os.getpid()}"
                    )
        except Abort as error:
            state, reason = None, str(error)
        else:
            reason = f"its state is {state.type.value}"
        if state is not None and state.is_pending():
            return True
        job.finish({"cancelled": f"Prefect did not let it start: {reason}"})
        return False

    def cancel(self, job: _Job, why: str) -> None:
        """Cancel ``job``: executing, its stages stop and the flow ends Cancelled; queued, it never starts."""
        with self.changed:
            if job.done or job.cancelled is not None:
                return
            job.cancelled = why
            queued = job in self.queue
            if queued:
                self.queue.remove(job)
        if queued:
            self._cancel_queued(job, why)
        elif job is self.current:
            # The engine ends a run on a termination signal as cancelled, not crashed, when a runner has said so.
            commit_cancel_intent()
            cancel_run()

    def _cancel_queued(self, job: _Job, why: str) -> None:
        try:
            with self.api:
                self.client.set_flow_run_state(job.flow_run.id, Cancelled(message=why), force=True)
        except Exception as error:  # noqa: BLE001 - the run never started: nothing else to undo
            _log.warning(f"alignflow serve: recording flow run {job.flow_run.name!r} as cancelled failed: {error}")
        job.finish({"cancelled": why})


def _now() -> datetime:
    return datetime.now(UTC)


def _line(message: str) -> str:
    return logging.Formatter(_FORMATS["format"], _FORMATS["datefmt"]).format(
        logging.LogRecord("alignflow.serve", logging.INFO, "", 0, message, None, None)
    )


def serve_pipelines(params: Params) -> None:
    """Register every pipeline's deployments with the Prefect server (PREFECT_API_URL) and execute their runs here.

    The runs join one Ray for as long as this serves: the cluster params or RAY_ADDRESS name, or else a
    local Ray started here once, so a run does not pay Ray's start-up and shutdown.
    """
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # `alignflow serve &` in a script ignores Ctrl-C
        signal.signal(signal.SIGINT, _interrupt)
    runner = None
    try:
        os.environ["RAY_ADDRESS"] = connect_ray(params.runner)
        signal.signal(signal.SIGTERM, _interrupt)  # joining Ray put Ray's own handler (abort) in its place
        hold_ray()
        queue_one_at_a_time = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE)
        # Per pipeline: a run on demand, and a retrain (gate, registry) on its cron from runner.schedules.
        served = [(name, FLOWS[name], None) for name in FLOWS]
        served += [(f"retrain-{name}", RETRAIN_FLOWS[name], params.runner.schedules.get(name)) for name in FLOWS]
        # one warm stage runner for every run served (run_pipeline's own would stop with its run)
        with warm_runner.started(), get_client(sync_client=True) as client:
            runner = InProcessRunner(Path.cwd(), client)
            runner.claim_project()
            for name, served_flow, cron in served:
                runner.add(
                    name,
                    served_flow,
                    served_flow.to_deployment(
                        name=name,
                        description=served_flow.description,
                        cron=cron,
                        concurrency_limit=queue_one_at_a_time,
                        enforce_parameter_schema=True,
                        tags=["alignflow"],
                        entrypoint_type=EntrypointType.MODULE_PATH,
                    ),
                )
            runner.start()
            print(f"alignflow serve: serving {', '.join(name for name, _, _ in served)}; Ctrl-C stops", flush=True)
            try:
                runner.serve()
            except KeyboardInterrupt:
                _stopping.set()
            runner.stop()
    except KeyboardInterrupt:
        pass
    finally:
        _deadline.cancel()
        ray.shutdown()
