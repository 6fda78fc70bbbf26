"""What the benches share: a scratch clone of this repo, its stages run by this environment's ``alignflow``."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# dvc.yaml's commands and the benches call `alignflow`: the one installed beside this Python
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def stage(project: Path, *args: str) -> None:
    """``alignflow stage <args>`` in ``project``; its progress output is dropped."""
    subprocess.run(["alignflow", "stage", *args], cwd=project, env=ENV, check=True, stdout=subprocess.DEVNULL)


def cold_start_project(project: Path, overrides: list[str] | tuple[str, ...] = ()) -> Path:
    """Clone this repo to ``project`` and build its data, base model and cold-start SFT model there."""
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(project)], check=True)
    for name in ("data", "base", "sft_cold"):
        stage(project, name, *overrides)
    return project
