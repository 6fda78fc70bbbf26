"""A Prefect server of one's own on 127.0.0.1 (SQLite under ``home``): for tests, benchmarks and trying the UI."""

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def local_prefect_server(home: Path, env: dict[str, str], timeout: float = 120) -> Iterator[dict[str, str]]:
    """Start ``prefect server start`` on a free port; yield ``env`` pointing clients at it; stop it after."""
    port = free_port()
    server_env = {
        **env,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # The UI asks the API at this address; by default it is port 4200's, not the port the server listens on.
        "PREFECT_SERVER_UI_API_URL": f"http://127.0.0.1:{port}/api",
    }
    server = subprocess.Popen(
        ["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=server_env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{api}/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise TimeoutError(f"the Prefect server on port {port} did not come up") from None
                time.sleep(0.5)
        yield {**server_env, "PREFECT_API_URL": api}
    finally:
        with contextlib.suppress(ProcessLookupError):  # already stopped (a test of a server that goes away)
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
