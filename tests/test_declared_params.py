"""A stage sees only the params its kind declares (tasks/kinds.yaml, hence dvc.yaml's ``params:``): any other read
raises, naming the stage, the key and the file to declare it in. The pipelines' tests run every stage kind's entry
through this view (tasks/common/registry.py hands each stage nothing else), so an undeclared read anywhere in
them fails those tests."""

import pickle
from pathlib import Path

import pytest

from tasks.common.declared_params import UndeclaredParamError, declared_params
from tasks.common.registry import stage_run
from tasks.kinds import DECLARATIONS, stage_kinds
from tasks.params.load import load_params

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def params():
    return load_params(REPO / "params.yaml")


def test_a_declared_key_reads_as_itself_and_an_undeclared_one_raises_naming_stage_key_and_file(params):
    # dpo_reference declares seed, device, dpo.init and eval.batch_size (and the prompt format)
    view = declared_params(params, stage_kinds()["dpo_reference"], "dpo_reference")
    assert view.device == params.device
    assert view.dpo.init == params.dpo.init
    assert view.eval.batch_size == params.eval.batch_size
    for read in (lambda: view.dpo.beta, lambda: view.eval.k, lambda: view.decoding, lambda: view.task.name):
        with pytest.raises(UndeclaredParamError) as refused:
            read()
        message = str(refused.value)
        assert "stage 'dpo_reference'" in message and str(DECLARATIONS) in message
    with pytest.raises(UndeclaredParamError, match="params key 'dpo.beta'"):
        _ = view.dpo.beta


def test_a_whole_declared_section_reads_whole_and_the_operations_sections_read_anywhere(params):
    view = declared_params(params, stage_kinds()["eval"], "eval@sft")
    assert view.agent == params.agent  # eval declares the whole agent section: its nested keys read too
    assert view.agent.tool_timeout_seconds == params.agent.tool_timeout_seconds
    assert view.task.system_prompt == params.task.system_prompt  # the prompt format, as every prompting kind reads
    assert view.runner.ray_address == params.runner.ray_address  # how a run is operated, not what it computes
    with pytest.raises(UndeclaredParamError, match="'task.name'"):
        _ = view.task.name


def test_an_undeclared_read_is_not_swallowed_by_getattr_with_a_default(params):
    view = declared_params(params, stage_kinds()["dpo_reference"], "dpo_reference")
    with pytest.raises(UndeclaredParamError):
        getattr(view.dpo, "beta", None)
    assert getattr(view.dpo, "no_such_key", None) is None  # a key params lacks is still an AttributeError


def test_the_view_travels_pickled_as_a_view(params):
    view = pickle.loads(pickle.dumps(declared_params(params, stage_kinds()["dpo_reference"], "dpo_reference")))
    assert view.dpo.init == params.dpo.init
    with pytest.raises(UndeclaredParamError):
        _ = view.dpo.beta


def test_a_stage_run_hands_its_stage_the_view_and_its_config_is_the_view_of_its_section(params):
    run = stage_run("dpo_reference", params)
    assert run.config.init == params.dpo.init
    with pytest.raises(UndeclaredParamError, match="'dpo.lr'"):
        _ = run.config.lr
    with pytest.raises(UndeclaredParamError, match="params key 'sft',"):
        _ = run.params.sft.lr
