"""The ``alignflow`` console script: a stage goes to the warm runner when one is running (``flows/warm_runner.py``),
before anything heavy is imported; everything else, and a stage with no runner, to ``flows.cli``. Ctrl-C ends any
command with one line (a stage's checkpoint stays for its resume), not a traceback."""

import sys

from flows.warm_runner import run_warm

INTERRUPTED = 130  # the shell's status for a command ended by SIGINT


def main() -> int:
    argv = sys.argv[1:]
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
