"""A stage's outputs land together or not at all, from one run at a time, and a disk that refuses a write is named
in one line. A path is made immutable for real with ``chattr +i`` (root only, as CI runs; permission bits stop
neither root nor the renaming of a directory within a writable parent); where that fails, those tests skip."""

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.cli import main
from tasks.common.artifacts import stage_lock
from tests.conftest import warm


@pytest.fixture
def read_only() -> Iterator:
    """Make a path refuse writes (its entries, its renaming) until the test ends."""
    made: list[Path] = []

    def make(path: Path) -> None:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
            pytest.skip("chattr +i is refused here (it needs root)")
        made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines())


def _leftovers(project: Path) -> list[str]:
    return sorted(str(p.relative_to(project)) for p in project.rglob(".tmp-*"))


def test_metrics_land_with_the_output_or_not_at_all(project, capsys, read_only):
    assert main(["stage", "data", "data.num_train=100"]) == 0
    read_only(project / "artifacts/data")
    capsys.readouterr()
    assert main(["stage", "data", "data.num_train=60"]) == 1
    err = capsys.readouterr().err
    said, failed = err.splitlines()  # the override sticks (said), then the one error line
    assert said == "alignflow: params.yaml updated with data.num_train=60", err
    assert failed.startswith("alignflow: error: artifacts/data:"), err
    # the metrics still describe the output that is there: the first run's
    assert json.loads((project / "metrics/data/metrics.json").read_text())["num_train"] == 100
    assert _rows(project / "artifacts/data/train.jsonl") == 100
    assert _leftovers(project) == []


def test_a_read_only_artifacts_directory_is_named_in_one_line(project, capsys, read_only):
    (project / "artifacts").mkdir()
    read_only(project / "artifacts")
    assert main(["stage", "data"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("alignflow: error: artifacts/") and "Traceback" not in err and err.count("\n") == 1, err
    assert [p for p in project.rglob("*") if p.is_file() and p.parent != project / "data"] == [project / "params.yaml"]


@pytest.mark.slow
def test_a_second_run_of_a_running_stage_is_refused_naming_the_first(project):
    with stage_lock("data"):  # the first run, holding the stage
        second = subprocess.run(["alignflow", "stage", "data"], cwd=project, env=warm(), capture_output=True, text=True)
    assert second.returncode == 2
    assert f"stage 'data' is already running in this project (pid {os.getpid()})" in second.stderr
    assert not (project / "artifacts").exists() and not (project / "metrics").exists()
    # once the first has finished, the stage runs
    assert subprocess.run(["alignflow", "stage", "data"], cwd=project, env=warm(), capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_stage_clears_a_killed_runs_temporary_output_but_not_a_running_ones(project):
    finished = subprocess.Popen(["true"])
    finished.wait()  # a pid that no process holds now
    artifacts = project / "artifacts"
    killed, running = artifacts / f".tmp-data-{finished.pid}", artifacts / f".tmp-data-{os.getpid()}"
    for temporary in (killed, running):
        (temporary / "train.jsonl").parent.mkdir(parents=True)
        (temporary / "train.jsonl").write_text("{}\n")
    assert subprocess.run(["alignflow", "stage", "data"], cwd=project, env=warm(), capture_output=True).returncode == 0
    assert not killed.exists() and (running / "train.jsonl").is_file()
