"""Orchestration overhead: the default pipeline run five ways, side by side, in one go.

  direct       each stage's command in dependency order, nothing around it
  dvc          `dvc repro` of the pipeline's final stages (`alignflow repro sft`)
  served       `alignflow run sft` with `alignflow serve` up in the project: the run executes in the
               serve's process (Prefect, DVC, torch and the flows imported, Ray joined, once), a
               Prefect flow, every stage on Ray, DVC recording the lock; the client only validates
               the params and follows the run
  prefect      a one-shot `alignflow run sft` (no serve) joining a running Ray cluster: the same flow
               in a process of its own, which pays the imports, the flow run's creation and its exit
  prefect+ray  a one-shot `alignflow run sft` starting a local Ray of its own, and stopping it

Each leg runs in its own fresh clone of this repo's HEAD, so every leg does the same work
from nothing. The infrastructure a deployment has running already, a Prefect server, a Ray
cluster (`ray start --head`, configured as alignflow configures a local Ray) and `alignflow serve`
(in the served leg's clone, joining that cluster; one per round), is started first and not timed;
it idles through every leg.

The target (Prefect + Ray + DVC add at most 5%) is judged on the `served` leg: production runs
start on a Prefect server, a Ray cluster and a serve that are already up. The one-shot legs show
what a run pays in a process of its own: `prefect` the imports, the flow run's creation and the
interpreter's exit, `prefect+ray` Ray's start-up and shutdown on top (about 3.5 s here); both are
fixed costs whatever the pipeline's length.

Then, on the last round's projects (every stage up to date, so all of a run is orchestration), three
runs in a row each way: the served deployment's flow run created through the Prefect API (what a
schedule or the UI's Run button does; the serve polls for it), `alignflow run sft` with the serve
up, and a one-shot `alignflow run sft`. A served run's cost is the same for the first run and the
third: the imports were paid once, when the serve started.

This machine's speed drifts with steal time by more than the effect measured, so two numbers
are reported:

- the end-to-end ratio of each leg to the direct one, from rounds that run the legs back to
  back in rotated order (the median of the per-round ratios);
- the overhead as it is spent: a watcher follows every leg's process tree and times each
  stage process (``alignflow stage ...``) from its start to its exit. A leg's time outside its
  stage processes is what the orchestrator adds in wall time (start-up, DVC status and commit,
  Prefect and Ray calls), and the CPU time that every other process (the orchestrator, Ray's
  daemons, the Prefect server) uses while a stage runs is what it takes from the stages' cores.
  Both are measured within one leg, so drift between legs cannot move them.

    .venv/bin/python -m bench.speed.orchestration [--rounds N] [KEY=VALUE ...]   # optional param overrides
"""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil

from flows.local_server import local_prefect_server
from flows.submit import connect
from tasks.common.cluster import LOCAL_RAY
from tasks.pipelines import PIPELINES

REPO = Path(__file__).resolve().parents[1]
# Ray enables token authentication by default (the token in ~/.ray/auth_token), but a client joining a cluster by
# address only presents it when told to: without this the prefect leg's join of the `ray start` cluster is refused.
# Every leg's stages run as processes of their own (no warm runner under `alignflow repro`: its forked stages are not
# `alignflow stage` processes the watcher could time); bench.speed.warm_runner measures what the runner saves.
ENV = {
    **os.environ,
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    "RAY_AUTH_MODE": "token",
    "ALIGNFLOW_WARM_RUNNER": "off",
}
PIPELINE = "sft"
FIELDS = ("wall", "stage_wall", "cpu_during_stages", "before_first", "after_last")
POLL_SECONDS = 0.05
# The target: what Prefect + Ray + DVC add to a run on running infrastructure, as production runs it.
TARGET_OVERHEAD = 0.05
IN_A_ROW = 3


@dataclass
class Leg:
    wall: float = 0.0
    stage_wall: float = 0.0  # the sum of the stage processes' lifetimes
    cpu_during_stages: float = 0.0  # CPU seconds the leg's other processes use while a stage runs
    before_first: float = 0.0  # from the leg's start to its first stage process's
    after_last: float = 0.0  # from its last stage process's exit to the leg's end

    @property
    def outside_stages(self) -> float:
        return self.wall - self.stage_wall


def _is_stage(process: psutil.Process) -> bool:
    """Whether ``process`` runs a stage: ``alignflow stage <name>`` itself, not a shell around it."""
    try:
        cmdline = process.cmdline()
    except psutil.Error:
        return False
    return len(cmdline) >= 3 and cmdline[-2] == "stage" and Path(cmdline[-3]).name == "alignflow"


class _Watcher(threading.Thread):
    """Polls a process tree: each stage process's lifetime, and the CPU time the other processes
    use while a stage runs (their own time only: a shell's reaped children are stages)."""

    def __init__(self, roots: list[psutil.Process], leg: Leg):
        super().__init__(daemon=True)
        self.roots, self.leg, self.done = roots, leg, threading.Event()
        self.first_start: float | None = None  # when the first stage process started
        self.last_exit: float | None = None  # when the latest stage process exited (as seen by a poll)
        self.alive: dict[int, float] = {}  # stage pid -> when it started
        self.cpu: dict[int, float] = {}  # other pid -> its latest CPU seconds
        self.counted = 0.0

    def run(self) -> None:
        while not self.done.is_set():
            self.poll()
            time.sleep(POLL_SECONDS)
        self.poll()
        for start in self.alive.values():  # whatever still runs ends with the leg
            self.leg.stage_wall += time.time() - start
            self.last_exit = time.time()

    def poll(self) -> None:
        stage_was_running, seen, now = bool(self.alive), set(), time.time()
        for process in _descendants(self.roots):
            seen.add(process.pid)
            if process.pid in self.alive:
                continue
            if _is_stage(process):
                try:  # the kernel's start time, not when a poll first saw it
                    self.alive[process.pid] = process.create_time()
                except psutil.Error:
                    self.alive[process.pid] = now
                if self.first_start is None:
                    self.first_start = self.alive[process.pid]
                continue
            try:
                times = process.cpu_times()
                self.cpu[process.pid] = times.user + times.system
            except psutil.Error:
                pass
        for pid in [pid for pid in self.alive if pid not in seen]:
            self.leg.stage_wall += now - self.alive.pop(pid)
            self.last_exit = now
        total = sum(self.cpu.values())
        if stage_was_running:
            self.leg.cpu_during_stages += total - self.counted
        self.counted = total


def _descendants(roots: list[psutil.Process]) -> list[psutil.Process]:
    """``roots`` and every process below them, from one pass over the process table: a watcher that walked
    /proc once per root, 20 times a second, took a tenth of a core from the stages it measures."""
    children: dict[int, list[psutil.Process]] = {}
    for process in psutil.process_iter(["ppid"]):
        children.setdefault(process.info["ppid"], []).append(process)
    found, frontier = [], list(roots)
    while frontier:
        process = frontier.pop()
        found.append(process)
        frontier += children.get(process.pid, [])
    return found


def watched(commands: list[list[str]], cwd: Path, env: dict, infrastructure: list[psutil.Process]) -> Leg:
    """Run ``commands`` one after another, watching each one's process tree and the infrastructure's (the Prefect
    server, the Ray cluster): a stage may run in either, and both may take CPU from it."""
    leg, watchers = Leg(), []
    start, started = time.perf_counter(), time.time()
    for command in commands:
        with tempfile.TemporaryFile("w+") as output:
            process = subprocess.Popen(command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT)
            watcher = _Watcher([psutil.Process(process.pid), *infrastructure], leg)
            watchers.append(watcher)
            watcher.start()
            if process.wait() != 0:
                output.seek(0)
                raise RuntimeError(f"{' '.join(command)} failed in {cwd}:\n{output.read()[-3000:]}")
            watcher.done.set()
            watcher.join()
    leg.wall = time.perf_counter() - start
    leg.before_first = min(w.first_start for w in watchers if w.first_start is not None) - started
    leg.after_last = started + leg.wall - max(w.last_exit for w in watchers if w.last_exit is not None)
    return leg


def clone(destination: Path, overrides: list[str]) -> Path:
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(destination)], check=True)
    if overrides:
        from omegaconf import OmegaConf

        params = OmegaConf.merge(OmegaConf.load(destination / "params.yaml"), OmegaConf.from_dotlist(overrides))
        OmegaConf.save(params, destination / "params.yaml")
    return destination


def stage_commands(project: Path) -> list[list[str]]:
    from flows.runner import read_dag

    return [["sh", "-c", stage.cmd] for stage in read_dag(project, PIPELINES[PIPELINE].targets)]


@contextmanager
def ray_cluster(env: dict) -> Iterator[tuple[str, list[psutil.Process]]]:
    """A local Ray head (``ray start``), configured as alignflow configures a local Ray; yields its address and
    its daemons. ``ray stop`` at the end stops every Ray started with ``ray start`` on this machine."""
    before = {p.pid for p in psutil.process_iter()}
    ray = str(Path(sys.executable).parent / "ray")
    started = subprocess.run(
        [ray, "start", "--head", f"--num-cpus={os.cpu_count()}", "--include-dashboard=false", "--disable-usage-stats",
         f"--system-config={json.dumps(LOCAL_RAY)}"],
        env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    address = re.search(r"ray start --address='([^']+)'", started.stdout).group(1)
    try:
        yield address, [p for p in psutil.process_iter() if p.pid not in before and p.pid != os.getpid()]
    finally:
        subprocess.run([ray, "stop"], env=env, check=False, capture_output=True)


@contextmanager
def serving(project: Path, env: dict) -> Iterator[psutil.Process]:
    """`alignflow serve` in ``project``, once it takes runs; stopped (SIGTERM) after."""
    log = project.with_name(f"{project.name}-serve.log")
    with log.open("wb") as output:
        serve = subprocess.Popen(
            ["alignflow", "serve"],
            cwd=project,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 600
        while (connection := connect(project)) is None:
            if serve.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"alignflow serve did not come up in {project}:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        connection.close()
        yield psutil.Process(serve.pid)
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()


def main(rounds: int, overrides: list[str]) -> None:
    with (
        tempfile.TemporaryDirectory() as scratch,
        local_prefect_server(Path(scratch) / "prefect", ENV) as prefect_env,
        ray_cluster(ENV) as (ray_address, ray_daemons),
    ):
        scratch = Path(scratch)
        port = prefect_env["PREFECT_API_URL"].rsplit(":", 1)[1].split("/")[0]
        (server,) = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and port in p.info["cmdline"]]
        commands = stage_commands(clone(scratch / "dag", overrides))
        targets = PIPELINES[PIPELINE].targets
        on_ray = {**prefect_env, "RAY_ADDRESS": ray_address}
        how = {
            "direct": (commands, ENV),
            "dvc": ([[sys.executable, "-m", "dvc", "repro", *targets]], ENV),
            "served": ([["alignflow", "run", PIPELINE]], on_ray),
            "prefect": ([["alignflow", "run", PIPELINE]], on_ray),
            "prefect+ray": ([["alignflow", "run", PIPELINE]], prefect_env),
        }
        legs: dict[str, list[Leg]] = {name: [] for name in how}
        order = list(how)
        for round_number in range(rounds):
            # The serve of this round's served leg, in that leg's clone: infrastructure, up before every leg.
            served = clone(scratch / f"served-{round_number}", overrides)
            with serving(served, on_ray) as serve:
                infrastructure = [server, *ray_daemons, serve]
                shift = round_number % len(order)
                for name in order[shift:] + order[:shift]:
                    leg_commands, env = how[name]
                    project = served if name == "served" else clone(scratch / f"{name}-{round_number}", overrides)
                    leg = watched(leg_commands, project, env, infrastructure)
                    legs[name].append(leg)
                    print(f"round {round_number + 1}: {name:<11} {_describe(leg)}", flush=True)
                if round_number == rounds - 1:  # on projects the legs left up to date
                    in_a_row = {
                        "scheduled on the served deployment (start to end)": scheduled_runs(prefect_env),
                        f"`alignflow run {PIPELINE}`, served": timed_runs(served, on_ray),
                        f"`alignflow run {PIPELINE}`, one-shot": timed_runs(
                            scratch / f"prefect-{round_number}", on_ray
                        ),
                    }

    settings = f": {' '.join(overrides)}" if overrides else ""
    print(f"\n{PIPELINE} pipeline, {len(commands)} stages, {rounds} round(s){settings}; medians:")
    direct = legs["direct"]
    for name, runs in legs.items():
        ratio = statistics.median(run.wall / base.wall for run, base in zip(runs, direct, strict=True))
        median = Leg(*(statistics.median(getattr(run, field) for run in runs) for field in FIELDS))
        print(f"  {name:<11} {ratio:6.3f}x direct  {_describe(median)}")

    stages = statistics.median(d.stage_wall for d in direct)
    overheads = {name: _overhead(legs[name], direct, stages) for name in ("served", "prefect", "prefect+ray")}
    end_to_end, as_spent = overheads["served"]
    verdict = "meets" if max(end_to_end, as_spent) <= TARGET_OVERHEAD else "misses"
    print(
        f"\norchestration overhead of the Prefect flow on Ray, with DVC recording the lock, run by `alignflow serve`, "
        f"over the direct run:\n"
        f"  end to end (median of the per-round ratios) {end_to_end:+.1%}, as spent {as_spent:+.1%}: "
        f"{verdict} the target of +{TARGET_OVERHEAD:.0%}"
    )
    for name, what in (
        ("prefect", "a one-shot `alignflow run` (no serve) joining the running Ray"),
        ("prefect+ray", "a one-shot `alignflow run` starting and stopping a Ray of its own"),
    ):
        one_shot_end_to_end, one_shot_as_spent = overheads[name]
        print(f"  {what}: {one_shot_end_to_end:+.1%} end to end, {one_shot_as_spent:+.1%} as spent")

    print(
        f"\n{IN_A_ROW} runs in a row of the up-to-date {PIPELINE} pipeline (every stage skipped: all of it is "
        "orchestration), seconds per run:"
    )
    width = max(map(len, in_a_row))
    for what, runs in in_a_row.items():
        print(f"  {what:<{width}}  " + ", ".join(f"run {i + 1} {run:5.2f}" for i, run in enumerate(runs)))


def timed_runs(project: Path, env: dict) -> list[float]:
    """The wall time of each of IN_A_ROW `alignflow run`s in ``project``, one after another."""
    times = []
    for _ in range(IN_A_ROW):
        started = time.perf_counter()
        subprocess.run(["alignflow", "run", PIPELINE], cwd=project, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return times


def _api(env: dict, path: str, payload: dict | None = None) -> object:
    """A Prefect API call; like Prefect's own client, retried while the server answers 503 (SQLite busy)."""
    data = None if payload is None else json.dumps(payload).encode()
    for attempt in range(10):
        request = urllib.request.Request(f"{env['PREFECT_API_URL']}{path}", data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            if error.code != 503 or attempt == 9:
                raise
        time.sleep(0.5)


def scheduled_runs(env: dict) -> list[float]:
    """Each of IN_A_ROW flow runs of the served deployment created through the Prefect API (as a schedule or the
    UI creates one) one after another, from its start to its end as Prefect records them: the serve polls for them
    (every POLL_SECONDS), which this leaves out."""
    (deployment,) = _api(env, "/deployments/filter", {"deployments": {"name": {"any_": [PIPELINE]}}})
    times = []
    for _ in range(IN_A_ROW):
        run = _api(env, f"/deployments/{deployment['id']}/create_flow_run", {})
        while (run := _api(env, f"/flow_runs/{run['id']}"))["state"]["type"] not in ("COMPLETED", "FAILED", "CRASHED"):
            time.sleep(0.1)
        if run["state"]["type"] != "COMPLETED":
            raise RuntimeError(f"the scheduled flow run ended {run['state']['type']}: {run['state']['message']}")
        times.append(
            (datetime.fromisoformat(run["end_time"]) - datetime.fromisoformat(run["start_time"])).total_seconds()
        )
    return times


def _overhead(runs: list[Leg], direct: list[Leg], stages: float) -> tuple[float, float]:
    """A leg's overhead over the direct leg: the median end-to-end ratio, and the overhead as spent: its time
    outside the stages plus the CPU its other processes take from them (a stage's threads use every core)."""
    pairs = list(zip(runs, direct, strict=True))
    end_to_end = statistics.median(run.wall / base.wall for run, base in pairs) - 1
    outside = statistics.median(run.outside_stages - base.outside_stages for run, base in pairs)
    taken = statistics.median(run.cpu_during_stages - base.cpu_during_stages for run, base in pairs)
    return end_to_end, (outside + taken) / stages


def _describe(leg: Leg) -> str:
    return (
        f"{leg.wall:6.1f} s: stages {leg.stage_wall:6.1f} s, outside them {leg.outside_stages:5.1f} s "
        f"({leg.before_first:.1f} before the first, {leg.after_last:.1f} after the last), "
        f"other processes' CPU while stages run {leg.cpu_during_stages:4.1f} s"
    )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    rounds = 1
    if arguments[:1] == ["--rounds"]:
        rounds, arguments = int(arguments[1]), arguments[2:]
    main(rounds, arguments)
