"""The rules of how pipelines run and where they store, that no single field states: Ray resources, cron schedules,
the retraining gate's guards and the DVC remote's URL. Checked with the other cross-field rules, before any stage
runs."""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Iterator
from datetime import datetime
from urllib.parse import urlsplit

from cronsim import CronSim, CronSimError
from dvc.config_schema import REMOTE_SCHEMAS

from tasks.common.config import GUARD_DIRECTIONS, Params
from tasks.common.config.fields import schema_fields
from tasks.common.config.operations import guard_direction


def operations_errors(params: Params) -> Iterator[str]:
    """How pipelines run and store: Ray resources, schedules, the retraining gate's guards, the remote."""
    from tasks.pipelines import PIPELINES  # the pipelines' names; flows imports tasks, not the other way, but here

    if "default" not in params.runner.resources:
        yield "runner.resources: needs a 'default' entry"
    for tracker in params.tracking.to:  # each tracker's import name is its own
        if importlib.util.find_spec(tracker) is None:
            yield f"tracking.to: {tracker} is not installed here (pip install 'alignflow[tracking]')"
    for pipeline, cron in params.runner.schedules.items():
        if pipeline not in PIPELINES:
            yield f"runner.schedules.{pipeline}: not a pipeline ({', '.join(PIPELINES)})"
        try:
            CronSim(cron, datetime.now())
        except CronSimError as error:
            yield f"runner.schedules.{pipeline}: not a cron expression: {cron!r} ({error})"
    for name in schema_fields(Params):
        parallel = getattr(getattr(params, name), "parallel", None)
        for resource, amount in getattr(parallel, "resources_per_worker", {}).items():
            key = f"{name}.parallel.resources_per_worker"
            if not str(resource).strip():
                yield f"{key}: a resource needs a name, got {resource!r}"
            elif not (math.isfinite(amount) and amount > 0):
                yield f"{key}.{resource}: an amount of a Ray resource must be a finite number > 0, got {amount}"
    retrain = params.retrain
    for metric, direction in retrain.directions.items():
        if direction not in ("higher", "lower"):
            yield f"retrain.directions.{metric}: higher or lower (which way the metric is better), got {direction!r}"
    for metric, tolerance in retrain.guards.items():
        if guard_direction(retrain, metric) is None:
            yield (
                f"retrain.guards.{metric}: the gate does not know which way {metric} is better; say it in "
                f"retrain.directions.{metric} (higher or lower), or guard one of {', '.join(GUARD_DIRECTIONS)}"
            )
        elif not (math.isfinite(tolerance) and tolerance >= 0):
            yield f"retrain.guards.{metric}: a tolerance must be a finite number >= 0, got {tolerance}"
    yield from _remote_errors(params.remote.url, params.remote.endpoint_url)


# Remote URL schemes DVC supports (its config schema's own list): '' is a local path, 'remote' another remote.
_REMOTE_SCHEMES = tuple(scheme for scheme in REMOTE_SCHEMAS if scheme not in ("", "remote"))


def _remote_errors(url: str, endpoint_url: str | None) -> Iterator[str]:
    """A remote is an absolute directory, ~/..., or a URL of a scheme DVC supports: anything else DVC would take as
    a directory relative to the project, and push into it."""
    parsed = urlsplit(url)
    if "://" in url:
        if parsed.scheme not in _REMOTE_SCHEMES or not (parsed.netloc or parsed.path.strip("/")):
            yield f"remote.url: not a URL of a scheme DVC supports ({', '.join(_REMOTE_SCHEMES)}), got {url!r}"
    elif not (url.startswith("~") or os.path.isabs(url)):
        known = parsed.scheme in _REMOTE_SCHEMES
        hint = f"; did you mean {parsed.scheme}://{url.split(':', 1)[1].lstrip('/')}?" if known else ""
        yield f"remote.url: must be an absolute directory, ~/..., or a URL such as s3://bucket/path, got {url!r}{hint}"
    if endpoint_url is not None:
        endpoint = urlsplit(endpoint_url)
        if endpoint.scheme not in ("http", "https") or not endpoint.netloc or any(c.isspace() for c in endpoint_url):
            yield f"remote.endpoint_url: not an http(s):// URL, got {endpoint_url!r}"
