"""The warm stage runner (``flows/warm_runner.py``): a stage it forks writes the bits a stage process of its own
writes, says what it would say and exits as it would; a stage whose environment the runner's imports cannot honour
runs cold; a killed command takes its stage with it."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from flows import warm_runner
from tests.conftest import ENV, lock_entries, make_project, md5_tree, stages_run

pytestmark = pytest.mark.slow
STAGES = ("data", "base", "sft")


def wait_ready(log: Path) -> None:
    deadline = time.monotonic() + 120
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "ready" in log.read_text(), log.read_text()


def served(log: Path) -> list[str]:
    """The runner's log: ``<pid> alignflow stage ...`` for each stage it forked, ``cold ...`` for each it refused."""
    return [line for line in log.read_text().splitlines() if line != "ready"]


def stage(project: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    # this process's environment as it is now, as the runner was started with it (a test before may have set a
    # variable in it, as an in-process `alignflow stage` sets HF_HUB_OFFLINE), on ENV's PATH
    environment = {**os.environ, "PATH": ENV["PATH"], **env}
    return subprocess.run(["alignflow", "stage", *argv], cwd=project, env=environment, capture_output=True, text=True)


@pytest.fixture(scope="module")
def runner():
    with warm_runner.started() as log:
        wait_ready(Path(log))
        yield Path(log)


def test_stages_forked_by_the_runner_write_the_bits_of_stage_processes_of_their_own(runner, uninterrupted, tmp_path):
    project = make_project(tmp_path / "warm")
    for name in STAGES:
        result = stage(project, name)
        assert result.returncode == 0, result.stderr
    forked = [line.split(" ", 1) for line in served(runner)[-3:]]
    assert [(pid.isdigit(), command) for pid, command in forked] == [(True, f"alignflow stage {n}") for n in STAGES]
    assert (project / "artifacts/sft/model.safetensors").read_bytes() == uninterrupted["weights"]


def test_a_refused_stage_says_why_and_exits_as_a_cold_one_does(runner, tmp_path):
    project = make_project(tmp_path / "refused")
    result = stage(project, "sft", "sft.lr=-1")
    assert result.returncode == 2
    assert "sft.lr" in result.stderr
    pid, command = served(runner)[-1].split(" ", 1)
    assert pid.isdigit() and command == "alignflow stage sft sft.lr=-1"


def test_a_stage_whose_thread_settings_differ_from_the_runners_runs_cold(runner, tmp_path):
    project = make_project(tmp_path / "cold")
    other_threads = str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1)  # tests/stage_env.py sets it per xdist worker
    result = stage(project, "data", OMP_NUM_THREADS=other_threads)
    assert result.returncode == 0, result.stderr
    assert served(runner)[-1] == "cold alignflow stage data"
    assert (project / "artifacts/data/train.jsonl").is_file()


def _sft_into_its_steps(runner, path: Path, **popen) -> tuple[subprocess.Popen, int]:
    """`alignflow stage sft` started (without end) in a new project, once the runner serves it and it is into its
    steps: the command, and the stage's process id."""
    project = make_project(path, ("sft.max_steps=100000",))
    for name in ("data", "base"):
        assert stage(project, name).returncode == 0
    environment = {**os.environ, "PATH": ENV["PATH"]}
    command = subprocess.Popen(["alignflow", "stage", "sft"], cwd=project, env=environment, **popen)
    deadline = time.monotonic() + 60
    while not served(runner)[-1].endswith("alignflow stage sft") and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int(served(runner)[-1].split()[0])
    time.sleep(2)  # into its steps
    return command, pid


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_command_killed_or_terminated_takes_its_stage_with_it(runner, tmp_path, how):
    command, pid = _sft_into_its_steps(runner, tmp_path / "killed")
    command.send_signal(how)
    assert command.wait(timeout=60) == -how  # the command dies of what killed it: DVC sees what a cold stage shows
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), f"the stage {pid} outlived its command"
    assert not (tmp_path / "killed/artifacts/sft").exists()


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_stage_killed_as_the_oom_killer_does_takes_its_command_with_it(runner, tmp_path, how):
    command, pid = _sft_into_its_steps(runner, tmp_path / "stage-killed", stderr=subprocess.PIPE, text=True)
    os.kill(pid, how)
    _, stderr = command.communicate(timeout=60)
    assert command.returncode == -how  # as a cold stage killed so: DVC reports the signal, not a traceback
    assert "Traceback" not in stderr, stderr
    assert not (tmp_path / "stage-killed/artifacts/sft").exists()


def test_alignflow_repro_runs_its_stages_warm_to_the_cold_runs_lock(uninterrupted, tmp_path):
    project = make_project(tmp_path / "repro")
    result = subprocess.run(["alignflow", "repro", "sft"], cwd=project, env=ENV, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    outs = {name: entry.get("outs") for name, entry in lock_entries(project).items()}
    assert outs == {name: entry.get("outs") for name, entry in uninterrupted["lock"].items()}


def test_alignflow_repro_handed_a_runner_forks_every_stage_from_it(runner, uninterrupted, tmp_path):
    """A runner the command did not start (a test process's own) takes the stages of an `alignflow repro` that
    names it: what the command sets in its environment (flows.cli.COMMAND_ENVIRONMENT) is what the runner started
    with, so none runs cold, and the lock is the cold run's."""
    project = make_project(tmp_path / "handed")
    before = len(served(runner))
    environment = {**os.environ, "PATH": ENV["PATH"]}  # the fixture's runner named in it, as under its block
    result = subprocess.run(["alignflow", "repro", "sft"], cwd=project, env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    handed = [line.split(" ", 1) for line in served(runner)[before:]]
    assert all(pid.isdigit() for pid, _ in handed), handed
    assert {command for _, command in handed} == {f"alignflow stage {name}" for name in stages_run(result.stdout)}
    outs = {name: entry.get("outs") for name, entry in lock_entries(project).items()}
    assert outs == {name: entry.get("outs") for name, entry in uninterrupted["lock"].items()}


def _processes_in(project: Path) -> list[int]:
    """The processes working in ``project``: the command, DVC's stage client, the runner, its session, the stage."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cwd").resolve() == project.resolve():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _sigint_as_in_a_terminal() -> None:
    """A test run started in the background inherits SIGINT ignored (POSIX shells do that to `cmd &`); a terminal's
    Ctrl-C reaches a command with SIGINT at its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# How each signal ends the command, and its one line. DVC ignores Ctrl-C while a stage runs and leaves it to the
# stage, which says so and ends (status 130); DVC then fails the repro (255) naming that status.
_STOPPED = {
    signal.SIGINT: (255, "alignflow: interrupted (stage sft)"),
    signal.SIGTERM: (-signal.SIGTERM, "alignflow: stopped by SIGTERM (repro sft)"),
    signal.SIGHUP: (-signal.SIGHUP, "alignflow: stopped by SIGHUP (repro sft)"),
}


@pytest.mark.parametrize("how", list(_STOPPED), ids=lambda how: how.name)
def test_a_stopped_repro_stops_its_stage_says_one_line_and_records_nothing(tmp_path, how):
    """Ctrl-C to `alignflow repro`'s process group, SIGTERM as `timeout` sends it, or SIGHUP as a closed terminal
    does, reaches the stage the warm runner forked (in a process group of its own) through its session: nothing is
    left running, nothing recorded, one line."""
    project = make_project(tmp_path / "stopped", ("sft.max_steps=100000",))
    log = tmp_path / "stdout"
    with log.open("w") as stdout:
        command = subprocess.Popen(
            ["alignflow", "repro", "sft"],
            cwd=project,
            env=ENV,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=_sigint_as_in_a_terminal,
        )
        deadline = time.monotonic() + 180
        while "Running stage 'sft'" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "Running stage 'sft'" in log.read_text(), log.read_text()
        time.sleep(5)  # into its steps
        os.killpg(command.pid, how)
        _, stderr = command.communicate(timeout=60)
    status, said = _STOPPED[how]
    assert command.returncode == status, stderr
    deadline = time.monotonic() + 30
    while _processes_in(project) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_in(project) == [], "a process of the stopped repro outlived it"
    assert "Traceback" not in stderr and stderr.count(said) == 1, stderr
    assert "sft" not in lock_entries(project) and not (project / "artifacts/sft").exists()


def test_a_runner_with_a_blas_thread_per_core_forks_its_stages_to_the_cold_bits(tmp_path, monkeypatch):
    """numpy's import starts a BLAS thread per core unless OMP_NUM_THREADS is 1, and the pool parks itself across a
    fork: a runner on two threads still serves, and the stages it forks write what cold ones write."""
    monkeypatch.delenv(warm_runner.ENV_VAR, raising=False)  # not this module's runner: one started on two threads
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    cold, warm = make_project(tmp_path / "cold"), make_project(tmp_path / "warm")
    for name in ("data", "base"):
        assert stage(cold, name).returncode == 0
    with warm_runner.started() as log:
        wait_ready(Path(log))
        for name in ("data", "base"):
            result = stage(warm, name)
            assert result.returncode == 0, result.stderr
        assert [line.split(" ", 1)[1] for line in served(Path(log))] == ["alignflow stage data", "alignflow stage base"]
        assert all(line.split(" ", 1)[0].isdigit() for line in served(Path(log)))
    for output in ("artifacts/data", "artifacts/base"):
        assert md5_tree(warm / output) == md5_tree(cold / output)
