"""Where stages put what they produce, and how they put it there without half-writes.

A stage writes into a temporary sibling of each output and renames them all into place, its metrics with its
model, only when it finishes, so a failed or killed stage never leaves a partial output (a leftover ``.tmp-*``
directory from a killed run is cleared on the next start); one run of a stage at a time holds its lock.
The paths here are the ones ``dvc.yaml`` declares.
"""

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from tasks.common.errors import MissingUpstreamError, StageBusyError
from tasks.kinds import model_kinds

USER_DATA = Path("data")  # your own datasets and incoming shards: the data stage's dvc.yaml dependency
ARTIFACTS = Path("artifacts")
DATA_DIR = ARTIFACTS / "data"
PREFERENCES_DIR = ARTIFACTS / "preferences"
REWARD_MODEL_DIR = ARTIFACTS / "reward_model"
JUDGE = "judge"  # the reward model's judge, beside its members
METRICS = Path("metrics")
CHECKPOINTS = Path(".alignflow") / "checkpoints"
# What is kept per user rather than per project: the machine's matmul peak, the registries' catalog.
USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "alignflow"


def stage_dir(stage: str) -> Path:
    """Where a stage writes what it produces: ``artifacts/sft``, ``artifacts/eval/sft`` for ``eval@sft``,
    ``artifacts/sft_rs/1`` for ``sft_rs@1``."""
    return ARTIFACTS / stage.replace("@", "/")


def model_dir(model: str) -> Path:
    """The HF directory of a model, named by the stage that trains it (``sft_rs@1``) or by its path (``sft_rs/1``)."""
    return stage_dir(model)


def upstream_model(model: str) -> Path:
    """The HF directory of a model an earlier stage trained (``grpo``, ``sft_rs/1``); when it is not there, an error
    naming the stage to run, instead of transformers' attempt to fetch the name from a model hub."""
    kinds, round_kinds = model_kinds()
    kind, _, round_name = model.replace("@", "/").partition("/")
    if kind not in (round_kinds if round_name else kinds):
        raise MissingUpstreamError(
            f"no stage trains a model named {model!r} (models: {', '.join(kinds)}, or {'|'.join(round_kinds)}/ROUND)"
        )
    path = model_dir(model)
    if not (path / "config.json").is_file():
        stage = f"{kind}@{round_name}" if round_name else kind
        raise MissingUpstreamError(
            f"{path}: no model there yet; run `alignflow stage {stage}` first (or `alignflow repro` a pipeline "
            "that contains it)"
        )
    return path


def metrics_dir(stage: str) -> Path:
    """The dvclive directory of a stage (``metrics.json`` plus ``plots/``): ``metrics/sft``, ``metrics/eval/sft``."""
    return METRICS / stage.replace("@", "/")


# Beside a stage's metrics, the wall-clock numbers of a stage that trains (throughput, MFU, seconds per step) and
# of each of its steps: not outputs, as they differ run to run and dvc.lock hashes a stage's outputs.
PERF_FILE, PERF_STEPS_FILE = "perf.json", "perf_steps.tsv"
# Beside the metrics of a stage that optimises a reward model's score: gold and proxy reward against sqrt(KL).
CURVE_FILE = "gold_vs_proxy.tsv"
EPISODES_FILE = "episodes.jsonl"  # an agent task's episodes, every turn, beside an evaluation's outputs


def member_dirs(root: Path = REWARD_MODEL_DIR) -> list[Path]:
    """The reward-model ensemble's model directories, in member order."""
    return sorted(root.glob("member-*"), key=lambda path: int(path.name.split("-")[1]))


def judge_dir(root: Path = REWARD_MODEL_DIR) -> Path | None:
    """The reward model's judge (trained on the held-out pairs), when it has one."""
    path = root / JUDGE
    return path if path.is_dir() else None


@contextlib.contextmanager
def stage_lock(stage: str) -> Iterator[None]:
    """One run of ``stage`` at a time in a project: a second is refused at once, naming the first (its outputs'
    temporary paths and checkpoint are the first run's). The lock is the kernel's, released when the holder dies;
    its file lives outside the project (``_locks``), so that a stage refused for bad input leaves no trace there."""
    locks = _locks()
    locks.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(locks / f"{stage.replace('/', '@')}.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise StageBusyError(
                f"stage {stage!r} is already running in this project (pid {holder}); wait for it to finish or stop it"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def _locks() -> Path:
    """This user's lock files for the project in the working directory (by its real path)."""
    project = hashlib.sha256(str(Path.cwd().resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"alignflow-{os.getuid()}" / "locks" / project


# A running stage's finished outputs (temporary, final), waiting to land together when it ends, and what to do once
# they have (clear its checkpoint); None outside `landing_together`.
_waiting: tuple[list[tuple[Path, Path]], list[Callable[[], None]]] | None = None


@contextlib.contextmanager
def landing_together() -> Iterator[None]:
    """Around a stage: every ``atomic_output`` inside lands when the block succeeds, all of them or none (a stage's
    metrics never land without its model), and the ``after_landing`` steps run only once they have."""
    global _waiting
    enclosing, _waiting = _waiting, ([], [])
    outputs, after = _waiting
    try:
        yield
        _land(outputs)
        for step in after:
            step()
    finally:
        _waiting = enclosing
        for temporary, _ in outputs:
            _remove(temporary)


def after_landing(step: Callable[[], None]) -> None:
    """Run ``step`` once the stage's outputs have landed (at once outside ``landing_together``)."""
    if _waiting is None:
        step()
    else:
        _waiting[1].append(step)


@contextlib.contextmanager
def atomic_output(final: Path, with_the_stage: bool = True) -> Iterator[Path]:
    """Yield a temporary path to fill; on success it replaces ``final`` (inside ``landing_together``, with the
    stage's other outputs, unless ``with_the_stage`` is false: a checkpoint lands at once), on failure it is
    removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".tmp-{final.name}-*"):
        if _owner_alive(stale):  # another process's own: left alone
            continue
        if stale.name.endswith("-previous") and not (final.exists() or final.is_symlink()):
            os.replace(stale, final)  # a run killed while landing: the output it was replacing goes back
        else:
            _remove(stale)
    temporary = final.parent / f".tmp-{final.name}-{os.getpid()}"
    landed = False
    try:
        yield temporary
        if _waiting is not None and with_the_stage:
            _waiting[0].append((temporary, final))
        else:
            _land([(temporary, final)])
        landed = True
    finally:
        if not landed:
            _remove(temporary)


def _land(outputs: list[tuple[Path, Path]]) -> None:
    """Move each temporary into its final place, the previous outputs aside first; when a move fails, the ones
    made are undone, so that every final path holds what it held before, and the error is raised."""
    moved: list[tuple[Path, Path]] = []  # (from, to), to undo in reverse
    try:
        for temporary, final in outputs:
            if final.exists() or final.is_symlink():
                # A directory cannot be replaced in one rename: move the old one aside first.
                previous = final.parent / f".tmp-{final.name}-{os.getpid()}-previous"
                os.replace(final, previous)
                moved.append((final, previous))
            os.replace(temporary, final)
            moved.append((temporary, final))
    except OSError:
        for source, destination in reversed(moved):
            # every move is undone that can be; one that cannot leaves its "-previous", which the stage's next
            # run puts back (atomic_output)
            with contextlib.suppress(OSError):
                os.replace(destination, source)
        raise
    for _, destination in moved:
        if destination.name.endswith("-previous"):
            with contextlib.suppress(OSError):  # landed all the same; the next run of the stage clears it
                _remove(destination)


def _owner_alive(temporary: Path) -> bool:
    """Whether the process that named ``temporary`` (``.tmp-<name>-<pid>[-previous]``) still runs."""
    pid = temporary.name.removesuffix("-previous").rsplit("-", 1)[-1]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)  # PermissionError: alive, another user's
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
