"""`alignflow serve`: per pipeline, a deployment to run it from the UI and one to retrain it on a schedule.

Each deployment's parameter form is its pipeline's run form (``flows/overrides.py``); the server
rejects a run whose parameters do not match that schema before anything runs.
A deployment admits one run at a time and queues the rest (``concurrency_limit=1``);
the flow's own lock also queues runs started from the CLI in the same project.

SIGINT (Ctrl-C) or SIGTERM stops it with status 0: it cancels the runs it is executing, pauses its
deployments' schedules (so a stopped serve does not pile up late runs), leaves Ray and exits. The
pause needs the Prefect server, whose client retries for minutes when the server is gone: past
``STOP_SECONDS`` the pause is given up and the process exits all the same.
"""

import asyncio
import os
import signal
import sys
import threading
from typing import Any

import ray
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import EntrypointType
from prefect.runner import Runner

from flows.pipelines import FLOWS
from flows.retrain import RETRAIN_FLOWS
from tasks.common.cluster import connect_ray
from tasks.common.config import Params

STOP_SECONDS = 5.0  # Prefect's own shutdown, pausing included, takes about a second when its server answers


def _give_up() -> None:
    print(
        f"alignflow serve: the Prefect server did not answer within {STOP_SECONDS:g} s; exiting without pausing "
        "the deployments",
        file=sys.stderr,
        flush=True,
    )
    ray.shutdown()
    os._exit(0)  # the main thread is stuck in the client's retries: only leaving the process ends them


_deadline = threading.Timer(STOP_SECONDS, _give_up)
_deadline.daemon = True


def _stop_within_deadline() -> None:
    if not _deadline.is_alive() and not _deadline.finished.is_set():
        _deadline.start()


def _interrupt(signum: int, frame: Any) -> None:
    _stop_within_deadline()
    raise KeyboardInterrupt


class _Runner(Runner):
    """Prefect's runner (what ``prefect.serve`` runs), its shutdown bounded by the deadline."""

    def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
        _stop_within_deadline()
        super().handle_sigterm(*args, **kwargs)  # stops the runner, then sys.exit(0) unwinds through its cleanup


def serve_pipelines(params: Params) -> None:
    """Register every pipeline's deployment with the Prefect server (PREFECT_API_URL) and serve its runs.

    The runs join one Ray for as long as this serves: the cluster params or RAY_ADDRESS name, or else a
    local Ray started here once, so a run does not pay Ray's start-up and shutdown.
    """
    # The runner takes SIGTERM over once it starts; until then, and for SIGINT throughout, these handlers stop it.
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # `alignflow serve &` in a script ignores Ctrl-C
        signal.signal(signal.SIGINT, _interrupt)
    try:
        os.environ["RAY_ADDRESS"] = connect_ray(params.runner)
        queue_one_at_a_time = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE)
        runner = _Runner(limit=None)  # each deployment queues its own runs
        # Per pipeline: a run on demand, and a retrain (gate, registry) on its cron from runner.schedules.
        served = [(name, FLOWS[name], None) for name in FLOWS]
        served += [(f"retrain-{name}", RETRAIN_FLOWS[name], params.runner.schedules.get(name)) for name in FLOWS]
        for name, served_flow, cron in served:
            runner.add_deployment(
                served_flow.to_deployment(
                    name=name,
                    description=served_flow.description,
                    cron=cron,
                    concurrency_limit=queue_one_at_a_time,
                    enforce_parameter_schema=True,
                    tags=["alignflow"],
                    entrypoint_type=EntrypointType.MODULE_PATH,
                )
            )
        print(f"alignflow serve: serving {', '.join(name for name, _, _ in served)}; Ctrl-C stops", flush=True)
        asyncio.run(runner.start())
    except KeyboardInterrupt:
        pass
    finally:
        _deadline.cancel()
        ray.shutdown()
