"""`alignflow registry`, `promote`, `rollback` and `lineage`: the model registry's commands (flows/registry.py,
flows/lineage.py) as the command line runs them."""

import argparse
import json
from pathlib import Path


def registry(args: argparse.Namespace) -> None:
    from flows.registry import registry as versions
    from flows.registry import render

    rows = versions(Path.cwd())
    print(json.dumps(rows, indent=2) if args.json else render(rows))


def _who(reason: str) -> str:
    import getpass

    return f"{getpass.getuser()} by hand" + (f": {reason}" if reason else "")


def promote(args: argparse.Namespace) -> None:
    from flows.lineage import recorded_model
    from flows.registry import assign_prod, commit_of, parse_version, pipeline_of, prod_version

    artifact, _, version = args.version.partition("@")
    pipeline_of(artifact)
    version = parse_version(version)
    commit = commit_of(Path.cwd(), artifact, version)  # names the version when there is none
    recorded_model(Path.cwd(), artifact, version, commit)  # a version whose commit holds no model is refused
    if (prod_version(Path.cwd(), artifact) or ("",))[0] == version:
        print(f"{artifact}@{version} is already in prod: nothing to do")
        return
    assign_prod(Path.cwd(), artifact, version, f"promoted by {_who(args.reason)}")
    print(f"{artifact}@{version} is in prod")


def rollback(args: argparse.Namespace) -> None:
    from flows.registry import pipeline_of
    from flows.registry import rollback as roll_back

    pipeline_of(args.model)
    print(f"{args.model}@{roll_back(Path.cwd(), args.model, _who(args.reason))} is in prod again")


def lineage(args: argparse.Namespace) -> None:
    from flows.lineage import lineage as traced
    from flows.lineage import render

    found = traced(Path.cwd(), args.version)
    print(json.dumps(found, indent=2) if args.json else render(found))
