"""The ``alignflow`` console script: a stage goes to the warm runner when one is running (``flows/warm_runner.py``),
before anything heavy is imported; everything else, and a stage with no runner, to ``flows.cli``. Ctrl-C, SIGTERM
and SIGHUP end a command with one line (a stage's checkpoint stays for its resume), not a traceback."""

import os
import signal
import sys

from flows.warm_runner import run_warm

INTERRUPTED = 130  # the shell's status for a command ended by SIGINT
# The commands whose stopping is theirs alone: Prefect's flows and `serve` handle SIGTERM themselves (a cancelled
# run puts params.yaml back, `serve` pauses its deployments).
_STOPPED_HERE = ("stage", "repro", "report", "generate", "fingerprints", "registry", "lineage")


def _stop_with_one_line(argv: list[str]) -> None:
    """On SIGTERM or SIGHUP: say so in one line, pass the signal to the stages this command started when it leads
    its process group (a signal to the group, as `timeout` sends, reaches them anyway), and die of it, as DVC and
    shells expect of a command so ended."""

    def stop(number: int, frame: object) -> None:
        signal.signal(number, signal.SIG_IGN)
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpgrp(), number)
        print(f"alignflow: stopped by {signal.Signals(number).name} ({' '.join(argv[:2])})", file=sys.stderr)
        sys.stderr.flush()
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)

    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, stop)


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] and argv[0] in _STOPPED_HERE:
        _stop_with_one_line(argv)
    try:
        if argv[:1] == ["stage"]:
            status = run_warm(argv)
            if status is not None:
                return status
        from flows.cli import main as cli_main

        return cli_main(argv)
    except KeyboardInterrupt:
        print(f"alignflow: interrupted ({' '.join(argv[:2])})", file=sys.stderr)
        return INTERRUPTED
