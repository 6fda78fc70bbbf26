"""The registries' catalog (tasks/common/registry_catalog.py): validating params reads the registries' names and
metadata from it, without torch; it tells what the registries tell, and a changed source is seen at once."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch  # noqa: F401 - here, the catalog is computed in this process, as it is wherever torch is imported

from tasks.common import registry_catalog
from tasks.common.config import ConfigError, Params
from tasks.common.config.fields import OneOf
from tasks.common.registry_type import Registry
from tasks.params.load import fields_with_keys, load_params
from tests.conftest import ENV

REPO = Path(__file__).resolve().parents[1]
# Every pick-by-name key of the schema, with the registry ("module:NAME") its choices come from.
REGISTRY_KEYS = {
    key: constraint.registry
    for key, info, _ in fields_with_keys(Params())
    for constraint in info.metadata
    if isinstance(constraint, OneOf) and constraint.registry is not None
}


def _live(reference: str) -> Registry:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def _assert_the_catalog_holds_what_the_registry_holds(reference: str) -> None:
    registry = _live(reference)
    entries = registry_catalog.registry_entries(reference)
    assert list(entries) == list(registry), reference  # registration order: the order choices are listed in
    for name, entry in entries.items():
        # after its trip through JSON: metadata that JSON cannot hold as it is (a tuple, a class) would differ
        assert vars(entry) == dict(registry[name].metadata), f"{reference}[{name!r}]"


@pytest.mark.parametrize("reference", sorted(set(REGISTRY_KEYS.values())))
def test_the_catalog_holds_what_each_registry_the_schema_reads_holds(reference):
    _assert_the_catalog_holds_what_the_registry_holds(reference)


def test_every_registry_in_the_catalog_is_a_registry_of_the_project_and_holds_the_same():
    references = set(registry_catalog.catalog())
    assert "tasks.rl.rewards:BUILT_IN" in references  # one that params rules read, beside the schema's
    for reference in references:
        assert isinstance(_live(reference), Registry), reference
        _assert_the_catalog_holds_what_the_registry_holds(reference)


def test_an_unknown_name_is_an_error_naming_each_key_and_the_registrys_names():
    overrides = [f"{key}=nosuch" for key in REGISTRY_KEYS]
    with pytest.raises(ConfigError) as error:
        load_params(REPO / "params.yaml", overrides)
    for key, reference in REGISTRY_KEYS.items():
        choices = ", ".join(_live(reference))
        assert f"{key}: must be one of " in str(error.value) and choices in str(error.value), key


def test_an_unknown_registry_is_an_error_naming_it():
    with pytest.raises(KeyError, match="no registry tasks.rl.core_algos:NO_SUCH"):
        registry_catalog.registry_entries("tasks.rl.core_algos:NO_SUCH")


@pytest.fixture
def toy_project(tmp_path, monkeypatch):
    """A project of one registry module, its catalog cached under tmp_path, computed by a stand-in that counts."""
    root = tmp_path / "project"
    (root / "tasks").mkdir(parents=True)
    (root / "models").mkdir()
    (root / "tasks" / "__init__.py").write_text("")
    (root / "tasks" / "losses.py").write_text('LOSSES = Registry("loss")\n')
    (root / "tasks" / "plain.py").write_text("X = 1\n")
    computed: list[list[str]] = []

    def read_registries(modules: list[str]) -> dict:
        computed.append(modules)
        return {f"{module}:LOSSES": {"first": {"sources": len(computed)}} for module in modules}

    monkeypatch.setattr(registry_catalog, "ROOT", root)
    monkeypatch.setattr(registry_catalog, "CATALOG", tmp_path / "cache" / "registries.json")
    monkeypatch.setattr(registry_catalog, "read_registries", read_registries)
    registry_catalog.catalog.cache_clear()
    yield root, computed
    registry_catalog.catalog.cache_clear()  # the project's own catalog again for the tests that follow


def test_the_catalog_is_computed_once_per_sources_and_a_changed_source_is_seen_at_once(toy_project):
    root, computed = toy_project
    assert registry_catalog.registry_entries("tasks.losses:LOSSES")["first"].sources == 1
    assert computed == [["tasks.losses"]]  # only the modules that may build a registry are imported

    registry_catalog.catalog.cache_clear()  # the next process
    assert registry_catalog.registry_entries("tasks.losses:LOSSES")["first"].sources == 1
    assert len(computed) == 1  # read from the cache

    (root / "tasks" / "losses.py").write_text('LOSSES = Registry("loss")\nLOSSES.register("second")\n')
    registry_catalog.catalog.cache_clear()
    assert registry_catalog.registry_entries("tasks.losses:LOSSES")["first"].sources == 2
    (root / "models" / "new_losses.py").write_text('MORE = Registry("loss")\n')  # a new module of registries
    registry_catalog.catalog.cache_clear()
    assert "models.new_losses:LOSSES" in registry_catalog.catalog()
    assert computed[-1] == ["models.new_losses", "tasks.losses"]
    assert len(json.loads(registry_catalog.CATALOG.read_text())) == 3  # the other sources' catalogs are kept


@pytest.mark.slow
def test_validation_imports_no_torch_with_a_cold_cache_or_a_warm_one(tmp_path):
    check = (
        "import sys; from tasks.params.load import load_params; load_params('params.yaml'); "
        "assert 'torch' not in sys.modules, 'validation imported torch'"
    )
    env = {**ENV, "XDG_CACHE_HOME": str(tmp_path)}
    for cache in ("cold", "warm"):
        ran = subprocess.run([sys.executable, "-c", check], cwd=REPO, env=env, capture_output=True, text=True)
        assert ran.returncode == 0, f"{cache} cache: {ran.stderr[-2000:]}"
        assert (tmp_path / "alignflow" / "registries.json").is_file()
