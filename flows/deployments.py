"""`alignflow serve`: one Prefect deployment per pipeline, triggered from the UI or on a schedule.

Each deployment's parameter form is the flow's typed ``Overrides``; the server
rejects a run whose parameters do not match that schema before anything runs.
A deployment admits one run at a time and queues the rest (``concurrency_limit=1``);
the flow's own lock also queues runs started from the CLI in the same project.
"""

import os

from prefect import serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import EntrypointType

from flows.pipelines import FLOWS
from tasks.common.cluster import connect_ray
from tasks.common.config import Params


def serve_pipelines(params: Params) -> None:
    """Register every pipeline's deployment with the Prefect server (PREFECT_API_URL) and serve its runs.

    The runs join one Ray for as long as this serves: the cluster params or RAY_ADDRESS name, or else a
    local Ray started here once, so a run does not pay Ray's start-up and shutdown.
    """
    os.environ["RAY_ADDRESS"] = connect_ray(params.runner)
    queue_one_at_a_time = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE)
    deployments = [
        pipeline_flow.to_deployment(
            name=name,
            description=pipeline_flow.description,
            cron=params.runner.schedules.get(name),
            concurrency_limit=queue_one_at_a_time,
            enforce_parameter_schema=True,
            tags=["alignflow"],
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        for name, pipeline_flow in FLOWS.items()
    ]
    serve(*deployments)
