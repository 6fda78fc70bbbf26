"""`alignflow serve` and the Prefect REST API, for the tests that drive a served project."""

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.pipelines import PIPELINES

API_ATTEMPTS = 3


def api(env: dict[str, str], path: str, payload: dict | None = None) -> Any:
    """Prefect's REST API. A server busy with another test's requests on a loaded machine may answer 503 (it did
    nothing: asked again) or not answer in time (asked again only for a read, as a write may have landed)."""
    data = None if payload is None else json.dumps(payload).encode()
    reads = payload is None or path.endswith("/filter")
    for attempt in range(1, API_ATTEMPTS + 1):
        request = urllib.request.Request(f"{env['PREFECT_API_URL']}{path}", data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            if error.code != 503 or attempt == API_ATTEMPTS:
                raise
        except (TimeoutError, urllib.error.URLError) as error:
            timed_out = isinstance(error, TimeoutError) or isinstance(error.reason, TimeoutError)
            if not (timed_out and reads) or attempt == API_ATTEMPTS:
                raise
        time.sleep(2 * attempt)


def deployments(env: dict[str, str]) -> list[dict]:
    return api(env, "/deployments/filter", {})


def wait_until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds} s for {what}")
        time.sleep(0.5)


def _sigint_as_in_a_terminal() -> None:
    """A test run started in the background inherits SIGINT ignored (POSIX shells do that to `cmd &`), which
    `alignflow serve` respects; a terminal's Ctrl-C reaches it with SIGINT at its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def serving(project: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """`alignflow serve` in ``project``, once its runner polls for every pipeline's runs."""
    since = datetime.now(UTC)
    with log.open("wb") as output:
        serve = subprocess.Popen(
            ["alignflow", "serve"],
            cwd=project,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_sigint_as_in_a_terminal,
        )
    try:

        def polling() -> bool:
            assert serve.poll() is None, f"alignflow serve exited:\n{log.read_text()}"
            # An earlier serve's polls leave a deployment READY for a while: this one's must be newer.
            polled = {d["name"]: d["last_polled"] for d in deployments(env)}
            return all(polled.get(name) and datetime.fromisoformat(polled[name]) > since for name in PIPELINES)

        wait_until(polling, 180, "alignflow serve to poll for its deployments' runs")
        yield serve
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
        serve.wait()
