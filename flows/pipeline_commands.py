"""`alignflow run` and `retrain`: a pipeline's Prefect flow as the command line runs it, with the overrides
`alignflow repro` takes. Those the pipeline's run form holds become the run's parameters; the others (another
pipeline's params, a reward mix's entries: an overlay such as examples/smollm2.args sets both) are written into
params.yaml first, as `repro` writes them, so that a run gets the params `repro` would."""

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The gate's and the remote's keys are the retrain's own, not a stage's: params.yaml takes them (the run reads them
# there), the run form the stages' keys.
RETRAIN_OWN_SECTIONS = ("retrain", "remote")


def stick(params_file: str | Path, overrides: Sequence[str]) -> None:
    """Write ``overrides`` (validated with the file already) into it and say so: a command's overrides stick, so a
    stage's outputs never disagree with the params file that dvc.lock and every later stage read."""
    from tasks.params.write import write_overrides

    if overrides:
        write_overrides(Path(params_file), overrides)
        print(f"alignflow: {params_file} updated with {' '.join(overrides)}", file=sys.stderr)


def check_user_data(params: Any) -> None:
    """Every row of your own data, read as the data stage will: a bad shard is named before Ray or Prefect start."""
    from tasks.data.datasets import read_shards

    for source in (params.data.train_file, params.data.test_file):
        if source is not None:
            read_shards(source, params.task.name, say_repeats=False)


def _form_overrides(pipeline: str, params: Any, overrides: Sequence[str]) -> list[str]:
    """The overrides the run form of ``pipeline`` holds; the others written into params.yaml now."""
    if not overrides:
        return []
    from flows.overrides import dag_project, form_model, split_by_form

    held, others = split_by_form(form_model(pipeline, params, dag_project(Path.cwd())), overrides)
    stick("params.yaml", others)
    return held


def run(args: argparse.Namespace) -> int | None:
    from tasks.params.load import load_params
    from tasks.params.write import restore

    params = load_params("params.yaml", args.overrides, runs=[args.pipeline])  # as `stage` says it, before Prefect
    check_user_data(params)
    before = Path("params.yaml").read_bytes()
    held = _form_overrides(args.pipeline, params, args.overrides)
    # The run restores what its form wrote if it is interrupted; this restores what `_form_overrides` wrote before
    # it. A run that fails keeps them, as a stage run does.
    wrote_others = held != args.overrides
    try:
        status = _run_with_form(args.pipeline, held, params)
    except BaseException as stopped:
        if wrote_others and not isinstance(stopped, Exception):  # Ctrl-C, SIGTERM
            restore(Path("params.yaml"), before)
        raise
    if status == 130 and wrote_others:  # Ctrl-C of a run in `alignflow serve`
        restore(Path("params.yaml"), before)
    return status


def _run_with_form(pipeline: str, held: list[str], params: Any) -> int | None:
    import threading

    from flows.submit import run_served

    # An `alignflow serve` of this project runs it in its process, which has Prefect, DVC and torch imported already.
    status = run_served(Path.cwd(), pipeline, held)
    if status is not None:
        return status
    from tasks.common.cluster import connect_ray

    # Ray's start-up mostly waits on its daemons, Prefect's import mostly computes: overlap the two.
    # (ray.init must run on the main thread, so the imports go to a helper thread.)
    importer = threading.Thread(target=importlib.import_module, args=("flows.pipelines",))
    importer.start()
    connect_ray(params.runner)
    importer.join()
    from flows.overrides import form_values
    from flows.pipelines import FLOWS, FORMS
    from flows.report import render

    report = FLOWS[pipeline](params=form_values(pipeline, FORMS[pipeline], held))
    print(render(report))
    return None


def retrain(args: argparse.Namespace) -> None:
    from tasks.common.cluster import connect_ray
    from tasks.params.load import load_params

    params = load_params("params.yaml", args.overrides, runs=[args.pipeline])  # before Prefect or Ray start
    from flows.overrides import form_values
    from flows.pipelines import FORMS
    from flows.retrain import RETRAIN_FLOWS, check_shards, data_sections

    # A shard the data stages would refuse is named, and moved to retrain.quarantine when it is new, before any work.
    check_shards(Path.cwd(), params, data_sections(args.pipeline, params))
    from tasks.params.write import write_overrides

    own = [o for o in args.overrides if o.partition("=")[0].strip().split(".")[0] in RETRAIN_OWN_SECTIONS]
    write_overrides(Path("params.yaml"), own)
    held = _form_overrides(args.pipeline, params, [o for o in args.overrides if o not in own])
    form = form_values(args.pipeline, FORMS[args.pipeline], held)
    connect_ray(params.runner)
    print(json.dumps(RETRAIN_FLOWS[args.pipeline](params=form), indent=2))
