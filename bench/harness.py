"""The benches' shared harness: a scratch clone of this repo, its stages run by this environment's ``alignflow``,
and the separate environment TRL runs in.

Every bench runs as a script, ``.venv/bin/python bench/NAME.py``, so Python puts ``bench/`` first on ``sys.path``
and a bench imports this module one way: ``from harness import ...`` (as the TRL-side scripts import
``trl_timer``). ``alignflow``'s own packages (``flows``, ``tasks``, ``models``) come from its editable install.
"""

import os
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# dvc.yaml's commands and the benches call `alignflow`: the one installed beside this Python
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
# The peer's environment, apart from the project's, so TRL never enters it (made on first use).
TRL_ENV = REPO / ".bench" / "trl"
TRL_PACKAGES = ["torch==2.13.0", "transformers==5.19.0", "tokenizers==0.23.3", "trl==1.16.0"]


def stage(project: Path, *args: str) -> None:
    """``alignflow stage <args>`` in ``project``; its progress output is dropped."""
    subprocess.run(["alignflow", "stage", *args], cwd=project, env=ENV, check=True, stdout=subprocess.DEVNULL)


def cold_start_project(project: Path, overrides: list[str] | tuple[str, ...] = ()) -> Path:
    """Clone this repo to ``project`` and build its data, base model and cold-start SFT model there."""
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(project)], check=True)
    for name in ("data", "base", "sft_cold"):
        stage(project, name, *overrides)
    return project


def trl_python() -> Path:
    """The Python of a virtual environment with TRL, made under ``.bench/`` on first use."""
    python = TRL_ENV / "bin" / "python"
    if not python.exists():
        print(f"making {TRL_ENV} with {' '.join(TRL_PACKAGES)} (once)", flush=True)
        venv.create(TRL_ENV, with_pip=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", TRL_PACKAGES[0]], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", *TRL_PACKAGES], check=True)
    return python
