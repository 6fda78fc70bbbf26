"""The ``alignflow`` console script: a stage goes to the warm runner when one is running (``flows/warm_runner.py``),
before anything heavy is imported; everything else, and a stage with no runner, to ``flows.cli``. Ctrl-C, SIGTERM
and SIGHUP end a command with one line (a stage's checkpoint stays for its resume), not a traceback."""

import contextlib
import os
import signal
import sys

from flows.warm_runner import run_warm

INTERRUPTED = 130  # the shell's status for a command ended by SIGINT
# The commands whose stopping is theirs alone: Prefect's flows and `serve` handle SIGTERM themselves (a cancelled
# run puts params.yaml back, `serve` pauses its deployments).
_STOPPED_HERE = ("stage", "repro", "report", "generate", "fingerprints", "registry", "lineage")
# The commands that run a Prefect flow in this process: Prefect's engine stops a run on SIGTERM, and leaves SIGHUP at
# its default, which killed the process outright and left its stage running on Ray until Ray noticed (over a
# minute on a busy machine).
_FLOWS_HERE = ("run", "retrain")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (DVC's stage command, the warm runner), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            children.setdefault(parent, []).append(int(entry))
    found, pending = [], list(children.get(pid, []))
    while pending:
        child = pending.pop()
        found.append(child)
        pending += children.get(child, [])
    return found


def _stop_with_one_line(argv: list[str]) -> None:
    """On SIGTERM or SIGHUP: pass the signal to the processes this command started (a stage's client forwards it to
    the warm runner's stage), say so in one line, and die of it, as DVC and shells expect of a command so ended."""

    def stop(number: int, frame: object) -> None:
        signal.signal(number, signal.SIG_IGN)
        try:
            for pid in _descendants(os.getpid()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, number)
            line = f"alignflow: stopped by {signal.Signals(number).name} ({' '.join(argv[:2])})\n"
            with contextlib.suppress(OSError):  # a hung-up terminal
                os.write(2, line.encode())
        finally:
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)

    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, stop)


def _hang_up_as_sigterm() -> None:
    """A hung-up terminal stops a flow run as SIGTERM does: its stages end and params.yaml is put back."""
    signal.signal(signal.SIGHUP, lambda number, frame: os.kill(os.getpid(), signal.SIGTERM))


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] and argv[0] in _STOPPED_HERE:
        _stop_with_one_line(argv)
    elif argv[:1] and argv[0] in _FLOWS_HERE:
        _hang_up_as_sigterm()
    try:
        if argv[:1] == ["stage"]:
            status = run_warm(argv)
            if status is not None:
                return status
        from flows.cli import main as cli_main

        return cli_main(argv)
    except KeyboardInterrupt:
        return interrupted(argv)


def interrupted(argv: list[str]) -> int:
    """Say that Ctrl-C ended the command ``argv``, in one line; the shell's status for it."""
    print(f"alignflow: interrupted ({' '.join(argv[:2])})", file=sys.stderr)
    return INTERRUPTED
