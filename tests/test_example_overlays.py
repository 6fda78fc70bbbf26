"""Every overlay under examples/ passes validation for each pipeline it is written for, as `alignflow repro PIPELINE
@FILE` reads it: a recipe a user copies from the docs is refused at the first command otherwise."""

import pytest

from flows.cli import build_parser
from flows.overrides import changed_overrides, form_model, form_values, split_by_form
from tasks.params.load import load_params
from tasks.params.write import write_overrides
from tasks.pipelines import PIPELINES
from tests.conftest import REPO

EVERY_PIPELINE = tuple(PIPELINES)
# each overlay and the pipelines its header names
PIPELINES_OF = {
    "examples/tiny.args": EVERY_PIPELINE,
    "examples/smollm2.args": EVERY_PIPELINE,
    "examples/reasoning_gym/smollm2.args": ("r1", "r1_zero"),
    "examples/smollm2_r1_zero.args": ("r1_zero",),
    "examples/calculator/smollm2.args": ("agent",),
    "examples/guess_number/game.args": ("agent",),
    "examples/shop/tiny.args": ("agent",),
    "examples/textarena/tiny.args": ("agent",),
    "examples/textarena/hardcore.args": ("agent",),
}


def test_every_overlay_is_listed_with_its_pipelines():
    found = {str(path.relative_to(REPO)) for path in (REPO / "examples").rglob("*.args")}
    assert found == set(PIPELINES_OF)


@pytest.mark.parametrize(
    ("overlay", "pipeline"), [(overlay, pipeline) for overlay, runs in PIPELINES_OF.items() for pipeline in runs]
)
def test_an_overlay_validates_for_its_pipelines(overlay, pipeline, monkeypatch):
    monkeypatch.chdir(REPO)  # `@FILE` is read from where the user stands, the project's root
    args = build_parser().parse_args(["repro", pipeline, f"@{overlay}"])
    assert args.overrides, overlay
    load_params(REPO / "params.yaml", args.overrides, runs=[pipeline])


# the overlays that set params of stages other than their pipelines' (every pipeline's, and reward mixes)
WRITTEN_FOR_EVERY_PIPELINE = [
    *(("examples/smollm2.args", pipeline) for pipeline in EVERY_PIPELINE),
    ("examples/reasoning_gym/smollm2.args", "r1"),
    ("examples/smollm2_r1_zero.args", "r1_zero"),
]


@pytest.mark.parametrize(("overlay", "pipeline"), WRITTEN_FOR_EVERY_PIPELINE)
def test_alignflow_run_of_an_overlay_trains_on_the_params_repro_would(overlay, pipeline, monkeypatch, tmp_path):
    """`alignflow run PIPELINE @FILE`: the overrides its run form holds go through the form, the others (another
    pipeline's params, a reward mix's entries) into params.yaml first; together they make the params.yaml `alignflow
    repro PIPELINE @FILE` writes."""
    monkeypatch.chdir(REPO)
    overrides = build_parser().parse_args(["run", pipeline, f"@{overlay}"]).overrides
    params_file = tmp_path / "params.yaml"
    params_file.write_text((REPO / "params.yaml").read_text())
    form = form_model(pipeline, load_params(params_file, overrides, runs=[pipeline]), REPO)
    held, others = split_by_form(form, overrides)
    write_overrides(params_file, others)
    values = form_values(pipeline, form, held)  # only what the submission set counts, not the form's defaults
    write_overrides(params_file, changed_overrides(values, load_params(params_file, runs=())))
    assert load_params(params_file, runs=()) == load_params(REPO / "params.yaml", overrides, runs=())
