"""Every overlay under examples/ passes validation for each pipeline it is written for, as `alignflow repro PIPELINE
@FILE` reads it: a recipe a user copies from the docs is refused at the first command otherwise."""

import pytest

from flows.cli import build_parser
from tasks.params.load import load_params
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
