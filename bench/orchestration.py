"""Orchestration overhead: the default pipeline run three ways, side by side, in one go.

  direct   each stage's command in dependency order, nothing around it
  dvc      `dvc repro`
  prefect  `alignflow run sft`: a Prefect flow, every stage on Ray, DVC recording the lock

Each leg runs in its own fresh clone of this repo's HEAD, so every leg does the
same work from nothing. A Prefect server is started first and not timed (it is
infrastructure a deployment has running already); Ray start-up is timed.

    .venv/bin/python bench/orchestration.py [KEY=VALUE ...]   # optional param overrides
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def clone(destination: Path, overrides: list[str]) -> Path:
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(destination)], check=True)
    if overrides:
        from omegaconf import OmegaConf

        params = OmegaConf.merge(OmegaConf.load(destination / "params.yaml"), OmegaConf.from_dotlist(overrides))
        OmegaConf.save(params, destination / "params.yaml")
    return destination


def timed(command: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def stage_commands(project: Path) -> list[str]:
    from flows.catalog import PIPELINES
    from flows.runner import read_dag

    return [stage.cmd for stage in read_dag(project, PIPELINES["sft"].targets)]


def start_prefect_server(home: Path) -> tuple[subprocess.Popen, dict]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**ENV, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server = subprocess.Popen(
        ["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    api = f"http://127.0.0.1:{port}/api"
    for _ in range(240):
        try:
            urllib.request.urlopen(f"{api}/health", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    return server, {**env, "PREFECT_API_URL": api}


def main(overrides: list[str]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        server, prefect_env = start_prefect_server(scratch / "prefect-home")
        try:
            direct_project = clone(scratch / "direct", overrides)
            commands = stage_commands(direct_project)
            stage_times = {command: timed(["sh", "-c", command], direct_project, ENV) for command in commands}
            times = {"direct": sum(stage_times.values())}
            times["dvc"] = timed([sys.executable, "-m", "dvc", "repro"], clone(scratch / "dvc", overrides), ENV)
            times["prefect"] = timed(["alignflow", "run", "sft"], clone(scratch / "prefect", overrides), prefect_env)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
    print(f"default pipeline ({len(commands)} stages{', ' + ' '.join(overrides) if overrides else ''})")
    for command, seconds in stage_times.items():
        print(f"  direct: {command:<28} {seconds:6.1f} s")
    for leg, seconds in times.items():
        print(f"  {leg:<8} {seconds:7.1f} s   {seconds / times['direct']:.3f}x direct")
    overhead = times["prefect"] / times["direct"] - 1
    print(f"orchestration overhead of Prefect + Ray + DVC: {overhead:+.1%} (target: under +10%)")


if __name__ == "__main__":
    main(sys.argv[1:])
