"""The ``alignflow`` console script: a stage goes to the warm runner when one is running (``flows/warm_runner.py``),
before anything heavy is imported; everything else, and a stage with no runner, to ``flows.cli``."""

import sys

from flows.warm_runner import run_warm


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["stage"]:
        status = run_warm(argv)
        if status is not None:
            return status
    from flows.cli import main as cli_main

    return cli_main(argv)
