import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from flows.fingerprints import SOURCES_STAGE
from tasks.pipelines import PIPELINES
from tests.stage_env import ENV, kill_at_first_checkpoint, warm

REPO = Path(__file__).resolve().parents[1]

# The longest test files, longest first (as measured by a full run, docs/testing.md): under `pytest -n 2` a file runs
# whole on one process, which holds two files at a time, and the file that starts last sets when the run ends.
LONGEST_FIRST = (
    "test_real_model.py",
    "test_retrain.py",
    "test_flows.py",
    "test_data_parallel.py",
    "test_serve.py",
    "test_served_runs.py",
    "test_r1_pipeline.py",
    "test_async_rollouts.py",
    "test_offline_to_online.py",
    "test_warm_runner.py",
    "test_distill_pipeline.py",
    "test_agent_pipeline.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))  # stable: the rest keep their order


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """An empty working directory holding the repo's params.yaml and an empty data/, as a stage sees it."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def produced(project: Path) -> list[str]:
    """What a stage left in ``project`` besides its params, its data/ and a bad.jsonl a test wrote there."""
    return sorted(p.name for p in project.iterdir() if p.name not in ("params.yaml", "bad.jsonl", "data"))


TINY = [line for line in (REPO / "examples/tiny.args").read_text().splitlines() if line and line[0] != "#"]


@pytest.fixture(scope="module")
def prefect_env(tmp_path_factory):
    """A Prefect server (SQLite) on 127.0.0.1, one per test module, and the environment pointing clients at it."""
    from flows.local_server import local_prefect_server

    with local_prefect_server(tmp_path_factory.mktemp("prefect-home"), ENV) as env:
        yield env


def make_project(path: Path, overrides: tuple[str, ...] = ()) -> Path:
    """A git repo holding the tracked files of this one, its params shrunk to TINY (then ``overrides``)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (REPO / name).is_file():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_bytes((REPO / name).read_bytes())
    # each project pushes to a remote of its own, never to ~/.alignflow
    own_remote = f"remote.url={path.resolve() / '.alignflow/remote'}"
    dotlist = [*TINY, own_remote, *overrides]
    params = OmegaConf.merge(OmegaConf.load(path / "params.yaml"), OmegaConf.from_dotlist(dotlist))
    OmegaConf.save(params, path / "params.yaml")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=path, check=True)
    return path


def md5_tree(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` by relative path, with the md5 of its bytes."""
    import hashlib

    return {
        str(p.relative_to(directory)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in directory.rglob("*")
        if p.is_file()
    }


def dvc(path: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=path, env=warm(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def repro(path: Path, pipeline: str = "sft") -> str:
    """`dvc repro` of a pipeline's final stages (what `alignflow repro <pipeline>` runs)."""
    from tasks.params.load import load_params

    return dvc(path, "repro", *PIPELINES[pipeline].stages(load_params(path / "params.yaml")))


def report_json(path: Path) -> dict:
    """`alignflow report --json` of the project at ``path``."""

    result = subprocess.run(["alignflow", "report", "--json"], cwd=path, env=ENV, capture_output=True, text=True)
    return json.loads(result.stdout)


def resume_after_kill(stage: str, project: Path) -> str:
    """Kill ``alignflow stage <stage>`` at its first checkpoint, run it again to the end; the rerun's output."""
    checkpoints = project / ".alignflow/checkpoints" / stage
    kill_at_first_checkpoint(["alignflow", "stage", stage], project, checkpoints)
    resumed = subprocess.run(["alignflow", "stage", stage], cwd=project, env=warm(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert not checkpoints.exists(), "a finished stage leaves no checkpoint behind"
    return resumed.stdout + resumed.stderr


@pytest.fixture
def one_thread():
    """The tiny model's ops are too small to split across threads: with one thread the toy GRPO run takes about
    0.25 s; with two it took 5-25 s on 2 cores another job was also using."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(path: Path) -> Path:
    """A tiny random Llama and the character tokenizer saved in HF format at ``path``."""
    from models import build_char_tokenizer, build_tiny_llama
    from tasks.common.config import BaseConfig

    tokenizer = build_char_tokenizer()
    config = BaseConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    build_tiny_llama(config, tokenizer, 0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def lock_entries(project: Path) -> dict:
    """dvc.lock's record of every stage (cmd, deps, params, outs with their hashes), order aside."""
    return yaml.safe_load((project / "dvc.lock").read_text())["stages"]


def stages_run(output: str) -> set[str]:
    """The stages a repro ran, less ``sources``, which every repro runs (it writes the fingerprints the others
    read; ``test_model_sources.py`` and ``test_task_sources.py`` show it re-runs nothing when they did not change)."""
    return set(re.findall(r"Running stage '([^']+)'", output)) - {SOURCES_STAGE}


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> dict:
    """The tiny pipeline run once by `dvc repro`, uninterrupted: the reference other runs must equal."""
    path = make_project(tmp_path_factory.mktemp("uninterrupted"))
    output = repro(path)
    return {
        "path": path,
        "output": output,
        "lock": lock_entries(path),
        "weights": (path / "artifacts/sft/model.safetensors").read_bytes(),
    }


def run_seed() -> int:
    """A seed that changes from one test run to the next but is the same in every test process of a run: the
    processes of ``pytest -n`` each collect the tests, and must agree on their parameters."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return int(hashlib.sha256(run.encode()).hexdigest(), 16) % 2**16 if run else random.randrange(2**16)
