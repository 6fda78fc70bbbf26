"""The ``alignflow`` command line."""

import argparse
import json
import os
import sys
from collections.abc import Sequence

DESCRIPTION = """\
alignflow: declarative, reproducible LLM post-training pipelines.

The pipeline is declared in dvc.yaml (stages, inputs, outputs) and params.yaml
(every stage's settings). Run it all with `dvc repro`: only stages whose inputs
or params changed run again. Each stage is also a command of its own.

Stages of the default pipeline:
  data        generate seeded train/held-out problem splits (or read your JSONL)
  base        build the tiny built-in model, or load base.model_path
  sft         supervised fine-tuning on worked solutions (resumes after a crash)
  eval@MODEL  held-out pass@1, pass@k, format rate, response length of MODEL
"""

EPILOG = """\
examples:
  dvc repro                              run the pipeline (skips what is up to date)
  alignflow stage sft sft.lr=1e-4        run one stage with a param override
  alignflow report --json                latest metrics of every stage as JSON
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="alignflow", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    stage = commands.add_parser("stage", help="run one pipeline stage", description="Run one pipeline stage.")
    stage.add_argument("name", help="stage name as in dvc.yaml: data, base, sft, eval@sft, ...")
    stage.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="param overrides, e.g. sft.lr=1e-4")
    stage.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")

    report = commands.add_parser("report", help="print every stage's latest metrics in pipeline order")
    report.add_argument("--json", action="store_true", help="one JSON object: stage -> flat metrics")
    return parser


def _quiet_libraries() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def _run_stage(args: argparse.Namespace) -> None:
    from tasks import check_stage_name, run_stage
    from tasks.config import load_params

    check_stage_name(args.name)
    params = load_params(args.params, args.overrides)
    _quiet_libraries()
    run_stage(args.name, params)


def _report(args: argparse.Namespace) -> None:
    from flows.report import collect, render

    report = collect()
    print(json.dumps(report, indent=2) if args.json else render(report))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from tasks.config import ConfigError
    from tasks.datasets import DatasetError

    try:
        {"stage": _run_stage, "report": _report}[args.command](args)
    except (ConfigError, DatasetError, ValueError) as error:
        print(f"alignflow: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
