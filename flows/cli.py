"""The ``alignflow`` command line."""

import argparse
import errno
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flows import pipeline_commands, registry_commands, warm_runner
from flows.pipeline_commands import check_user_data, stick
from tasks.common.registry import usage_name
from tasks.kinds import stage_kinds
from tasks.pipelines import PIPELINES


def _description() -> str:
    """The CLI's help, its pipelines and stages read from the catalog and the stage registry."""
    stages = [(usage_name(kind), kind.description) for kind in stage_kinds().values()]
    width = max(len(name) for name, _ in stages) + 3
    return (
        "alignflow: declarative, reproducible LLM post-training pipelines.\n\n"
        "The pipelines are declared in dvc.yaml (stages, inputs, outputs) and params.yaml\n"
        "(every stage's settings). Run one with `alignflow repro PIPELINE` (`dvc repro` of its\n"
        "final stages; `dvc repro` alone runs them all): only stages whose inputs or params\n"
        "changed run again. Each stage is also a command of its own.\n\n"
        f"Pipelines: {', '.join(PIPELINES)}. Stages:\n" + "\n".join(f"  {name:<{width}}{what}" for name, what in stages)
    )


EPILOG = """\
examples:
  alignflow repro sft                    run the default pipeline (skips what is up to date)
  alignflow repro rlhf                   SFT -> reward model -> PPO
  alignflow repro r1                     cold start -> GRPO -> rejection sampling -> SFT -> RL
  alignflow stage sft sft.lr=1e-4        run one stage with a param override
  alignflow report --json                latest metrics of every stage as JSON
  alignflow retrain sft                  new shards -> candidate -> gate against prod -> registry
  alignflow registry                     model versions, stages and the gate's decisions
  alignflow lineage sft@v3               stages, params, shards and models behind a version
"""


_OVERRIDES = "param overrides (e.g. sft.lr=1e-4), or @FILE of them, one a line"
_STICK = (
    "Overrides are validated with params.yaml, then written into it before anything runs (and said), so that every "
    "later command, and dvc.lock, sees the same params."
)


class _Parser(argparse.ArgumentParser):
    """Reads ``@file`` as more arguments, one a line, skipping blank lines and ``#`` comments: a params overlay
    (``alignflow run r1 @examples/smollm2.args``)."""

    def convert_arg_line_to_args(self, arg_line: str) -> list[str]:
        line = arg_line.strip()
        return [] if not line or line.startswith("#") else [line]


def build_parser() -> argparse.ArgumentParser:
    """The `alignflow` command line: its commands, their arguments, and `@FILE` overlays read one argument a line."""
    parser = _Parser(
        prog="alignflow",
        fromfile_prefix_chars="@",
        description=_description(),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    stage = commands.add_parser(
        "stage",
        help="run one pipeline stage",
        description="Run one pipeline stage (upstream stages are not run: see `alignflow repro STAGE`). " + _STICK,
    )
    stage.add_argument("name", help="stage name as in dvc.yaml: data, base, sft, eval@sft, ...")
    stage.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=_OVERRIDES)
    stage.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")

    repro = commands.add_parser(
        "repro",
        help="run a pipeline, or a stage and everything upstream of it, with dvc repro",
        description="`dvc repro` of a pipeline's final stages, or of one stage (`alignflow repro eval@grpo`: train "
        "and evaluate up to grpo): what is up to date is skipped. " + _STICK,
    )
    repro.add_argument(
        "target", metavar="PIPELINE|STAGE", help=f"a pipeline ({', '.join(PIPELINES)}) or a stage of dvc.yaml"
    )
    repro.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=_OVERRIDES)

    run = commands.add_parser(
        "run",
        help="run a pipeline as a Prefect flow, each stage on Ray",
        description="Run a pipeline as a Prefect flow (stages on Ray; up-to-date stages are skipped). "
        "Overrides are validated, then written into params.yaml so dvc.lock records them. When `alignflow serve` "
        "runs in this project, the run executes there (its logs and report stream back here; Ctrl-C cancels it).",
    )
    run.add_argument("pipeline", choices=PIPELINES, help="pipeline name: " + ", ".join(PIPELINES))
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=_OVERRIDES)

    commands.add_parser(
        "serve",
        help="serve one Prefect deployment per pipeline (UI-triggered and scheduled runs)",
        description="Register a deployment per pipeline with the Prefect server at PREFECT_API_URL and run "
        "what it schedules: runs triggered from the UI's parameter form, and cron schedules from "
        "runner.schedules in params.yaml. Runs of a deployment are queued one at a time. Ctrl-C, SIGTERM or "
        "SIGHUP stops it within seconds (status 0), pausing its deployments if the server answers.",
    )

    retrain = commands.add_parser(
        "retrain",
        help="retrain a pipeline on the current data, gate it against prod, register it",
        description="Validate and version new data shards, run the pipeline (a DVC experiment), score the candidate "
        "and the prod champion on the same held-out split, register the candidate (GTO tag) and promote it to prod "
        "if it beats the champion by retrain.margin with no guard metric past its tolerance; push to the remote.",
    )
    retrain.add_argument("pipeline", choices=PIPELINES, help="pipeline name: " + ", ".join(PIPELINES))
    retrain.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="param overrides, e.g. sft.lr=1e-4")

    registry = commands.add_parser("registry", help="list model versions, their stages and the gate's decisions")
    registry.add_argument("--json", action="store_true", help="every version as JSON, for scripts")

    promote = commands.add_parser("promote", help="put a model version in prod by hand (recorded as such)")
    promote.add_argument("version", metavar="MODEL@VERSION", help="e.g. sft@v2")
    promote.add_argument("--reason", default="", help="why, for the registry's history")

    rollback = commands.add_parser("rollback", help="put back in prod the version that was there before")
    rollback.add_argument("model", metavar="MODEL", help="e.g. sft")
    rollback.add_argument("--reason", default="", help="why, for the registry's history")

    lineage = commands.add_parser(
        "lineage", help="the stages, params, data shards and upstream models behind a model version"
    )
    lineage.add_argument("version", metavar="MODEL[@VERSION]", help="e.g. sft@v3; a bare model means its prod version")
    lineage.add_argument("--json", action="store_true", help="as JSON")

    generate = commands.add_parser(
        "generate",
        help="write dvc.yaml and params.yaml from the stage kinds and the params schema",
        description="Write dvc.yaml's stages from tasks/kinds.py and params.yaml from the schema, keeping "
        "params.yaml's values (a new key at its default). --check writes nothing and fails when either is stale.",
    )
    generate.add_argument("--check", action="store_true", help="exit 1 if a file would change, naming it")

    commands.add_parser(
        "fingerprints",
        help="write the sha256 of each model source and task module params.yaml names (dvc.yaml's sources stage)",
        description="Write sources/*.sha256: the content of each model source and task module of your own that "
        "params.yaml names, the files dvc.yaml lists in their stead. dvc.yaml's `sources` stage runs this on "
        "every repro; a file whose source is unchanged keeps its bytes.",
    )

    report = commands.add_parser("report", help="print every stage's latest metrics in pipeline order")
    report.add_argument("--json", action="store_true", help="one JSON object: stage -> flat metrics")
    return parser


# What a stage sets in its environment before the Hugging Face libraries read it, unless set already.
LIBRARY_ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def quiet_libraries() -> None:
    for key, value in LIBRARY_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def _bounds(info: Any) -> str:
    """A field's constraints as a reader writes them: ``> 0``, ``<= 1``, ``one of a, b``."""
    words = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    parts = [f"{words[name]} {getattr(c, name)}" for c in info.metadata for name in words if hasattr(c, name)]
    parts += [f"one of {', '.join(c.choices)}" for c in info.metadata if hasattr(c, "choices")]
    return f" [{'; '.join(parts)}]" if parts else ""


def _stage_help(name: str, params_file: str) -> None:
    """``alignflow stage NAME --help``: what the stage does and reads, and every param it reads with its value,
    bounds and help."""
    from tasks.common.registry import parse_stage_name
    from tasks.params.load import field_at, fields_with_keys, load_params

    kind, _ = parse_stage_name(name)
    params = load_params(params_file, runs=[name], as_stages=True) if Path(params_file).is_file() else None
    print(f"alignflow stage {usage_name(kind)}: {kind.description}\n")
    print("reads: " + (", ".join(f"{key} ({read})" for key, read in kind.reads.items()) or "nothing upstream"))
    print(f"writes: artifacts/{kind.name}/... ({kind.writes})\n\nparams (KEY=VALUE overrides):")
    from tasks.common.config import Params

    values = {key: value for key, _, value in fields_with_keys(params or Params())}
    for listed in kind.param_keys:
        for key, value in values.items():
            if key == listed or key.startswith(f"{listed}."):
                info = field_at(key)
                help = info.description if info is not None else ""
                print(f"  {key} = {json.dumps(value)}{_bounds(info) if info is not None else ''}\n      {help}")


def _run_stage(args: argparse.Namespace) -> None:
    from tasks.common.registry import parse_stage_name, run_stage
    from tasks.params.load import load_params

    parse_stage_name(args.name)
    quiet_libraries()  # before anything imports huggingface_hub, which reads HF_HUB_OFFLINE once, at import
    params = load_params(args.params, args.overrides, runs=[args.name], as_stages=True)
    if args.overrides:
        check_user_data(params)  # a bad row of your own is refused before the overrides that name it stick
    stick(args.params, args.overrides)
    run_stage(args.name, params)


def _repro_targets(target: str, params: Any) -> list[str]:
    """The dvc.yaml stages ``alignflow repro TARGET`` reproduces: a pipeline's final stages, or the stage named."""
    if target in PIPELINES:
        return list(PIPELINES[target].stages(params))
    from dvc.repo import Repo

    from tasks.common.config import ConfigError

    with Repo() as repo:
        stages = [stage.addressing for stage in repo.index.stages]
    if target not in stages:
        raise ConfigError(
            f"repro {target!r}: neither a pipeline ({', '.join(PIPELINES)}) nor a stage of dvc.yaml "
            f"({', '.join(stages)})"
        )
    return [target]


def _repro(args: argparse.Namespace) -> int:
    from dvc.cli import main as dvc_main

    from tasks.common.trackers import pipeline_run
    from tasks.params.load import load_params

    # DVC removes a stage's outputs before running it: a params.yaml the stage would refuse must never get that far.
    params = load_params("params.yaml", args.overrides, runs=[args.target])
    targets = _repro_targets(args.target, params)
    check_user_data(params)
    stick("params.yaml", args.overrides)
    with pipeline_run(args.target, params.tracking) as tracked, warm_runner.started():
        status = dvc_main(["repro", *targets])  # the stages DVC runs skip the imports a stage process would pay
        tracked.failed = status != 0
    if status == 0 and params.remote.push:
        from flows.remote import push

        pushed, outcome = push(Path.cwd(), params.remote)
        # A remote that is down costs no work: everything is in the local cache and the next run pushes it.
        print(outcome if pushed else f"alignflow: warning: {outcome}", file=sys.stdout if pushed else sys.stderr)
    return status


def _serve(args: argparse.Namespace) -> None:
    from flows.deployments import serve_pipelines
    from tasks.params.load import load_params

    serve_pipelines(load_params("params.yaml", runs=()))  # each run validates its pipeline


def _report(args: argparse.Namespace) -> None:
    from flows.report import collect, render

    report = collect()
    print(json.dumps(report, indent=2) if args.json else render(report))


def _fingerprints(args: argparse.Namespace) -> int:
    from flows.fingerprints import refresh_fingerprints
    from tasks.params.load import load_params

    refresh_fingerprints(load_params("params.yaml", runs=()), Path.cwd())  # names only: their stages check the rest
    return 0


def _generate(args: argparse.Namespace) -> int:
    from flows.generate import generated, stale

    project = Path.cwd()
    if args.check:
        outdated = stale(project)
        for path in outdated:
            print(f"alignflow: {path.name} is stale: run `alignflow generate`", file=sys.stderr)
        return 1 if outdated else 0
    for path, text in generated(project).items():
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(text)
        temporary.replace(path)
        print(f"wrote {path.name}")
    return 0


# The commands that read the project's git history or DVC pipeline, and so need both.
_IN_A_PROJECT = ("repro", "run", "retrain", "registry", "promote", "rollback", "lineage", "report")


def _require_project(command: str) -> None:
    """One line naming what is missing where, before git, DVC or GTO answer with a traceback."""
    from tasks.common.config import ConfigError

    here = Path.cwd()
    above = (here, *here.parents)
    for needed, what in ((".dvc", "a DVC project"), (".git", "a git repository")):
        if not any((directory / needed).exists() for directory in above):
            raise ConfigError(
                f"{here}: not in {what} (no {needed} here or above); `alignflow {command}` runs in an alignflow "
                "project: a clone of it, or any git repository with `dvc init` run"
            )


def _require_a_commit(command: str) -> None:
    """In a git repository, one line when it has no commit yet: DVC and DVCLive read the repository's HEAD, and
    would answer with a traceback after the stage's work."""
    from tasks.common.config import ConfigError

    inside = subprocess.run(["git", "rev-parse", "--git-dir"], capture_output=True, text=True)
    head = (
        subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], capture_output=True)
        if inside.returncode == 0
        else None
    )
    if head is not None and head.returncode != 0:
        raise ConfigError(
            f"{Path.cwd()}: the git repository has no commit yet; commit the project first (git add -A && git "
            f"commit -m init): `alignflow {command}` records what it ran against a commit"
        )


# What `main` sets in a command's environment, unless set already: the stages and the warm runner the command starts
# inherit it, and a runner started elsewhere forks the command's stages only when it started with the same (PREFECT_
# is read at import).
COMMAND_ENVIRONMENT = {
    # The Prefect server a flow run starts for itself would report usage over the network (an ERROR line offline).
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # Its 20 s to start that server ran out on a machine busy training (the run then failed before any stage).
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for key, value in COMMAND_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    if argv[:1] == ["stage"] and len(argv) > 1 and not argv[1].startswith("-") and {"-h", "--help"} & set(argv):
        argv = [arg for arg in argv if arg not in ("-h", "--help")]
        params_file = argv[argv.index("--params") + 1] if "--params" in argv else "params.yaml"
        from tasks.common.config import ConfigError

        try:
            _stage_help(argv[1], params_file)
        except ConfigError as error:
            print(f"alignflow: error: {error}", file=sys.stderr)
            return 2
        return 0
    args = build_parser().parse_args(argv)
    from tasks.common.config import ConfigError
    from tasks.common.errors import NonFiniteError
    from tasks.data.datasets import DatasetError

    try:
        if args.command in _IN_A_PROJECT:
            _require_project(args.command)
        if args.command in (*_IN_A_PROJECT, "stage"):
            _require_a_commit(args.command)
        commands = {
            "stage": _run_stage,
            "repro": _repro,
            "run": pipeline_commands.run,
            "serve": _serve,
            "retrain": pipeline_commands.retrain,
            "registry": registry_commands.registry,
            "promote": registry_commands.promote,
            "rollback": registry_commands.rollback,
            "lineage": registry_commands.lineage,
            "report": _report,
            "generate": _generate,
            "fingerprints": _fingerprints,
        }
        return commands[args.command](args) or 0
    except NonFiniteError as error:
        print(f"alignflow: error: {error}. The stage stopped before that update and wrote no output.", file=sys.stderr)
        return 1
    except (ConfigError, DatasetError, ValueError) as error:
        print(f"alignflow: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        # what the machine refuses (a read-only or full disk): the path, not a traceback; anything else is a bug
        if error.errno not in _REFUSED_BY_THE_MACHINE or error.filename is None:
            raise
        print(f"alignflow: error: {error.filename}: {error.strerror}", file=sys.stderr)
        return 1


_REFUSED_BY_THE_MACHINE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


if __name__ == "__main__":
    sys.exit(main())
