"""The registries' names and metadata without importing them: validating params.yaml checks every pick-by-name
param against its registry (tasks/common/registry_type.py), and the modules that hold the registries import torch
and transformers, seconds that a command with nothing to train (a no-op ``alignflow repro``) should not spend.

The registries stay the one source of truth: the catalog is what importing them gives, computed once (in a
subprocess, so that this process stays free of torch; in this one when torch is here already) and kept as JSON in
the user's cache directory, keyed by a hash of the project's own code (every ``*.py`` of the ``tasks`` and
``models`` packages). A loss registered in a new module, or a registry of your own, is seen on the next run.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tasks.common.artifacts import USER_CACHE, atomic_output

ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the tasks and models packages
PACKAGES = ("tasks", "models")
CATALOG = USER_CACHE / "registries.json"
KEPT = 8  # catalogs of other sources kept beside the current one: clones or branches at other commits
Catalog = dict[str, dict[str, dict[str, Any]]]  # "module:NAME" -> entry name -> metadata

# Imports the registry modules apart and prints the catalog, so the caller never imports torch.
_COMPUTE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tasks.common.registry_catalog import read_registries
print(json.dumps(read_registries(sys.argv[2:])))
"""


def registry_entries(reference: str) -> dict[str, SimpleNamespace]:
    """The entries of the registry ``reference`` ("module:NAME"), in registration order, each one's metadata
    readable as attributes: ``registry_entries("tasks.rl.core_algos:ADVANTAGE_ESTIMATORS")["gae"].needs_critic``."""
    registries = catalog()
    if reference not in registries:
        raise KeyError(f"no registry {reference}; the project's registries: {', '.join(registries)}")
    return {name: SimpleNamespace(**metadata) for name, metadata in registries[reference].items()}


@functools.cache
def catalog() -> Catalog:
    """Every registry of the project's registry modules: from the cache when the project's code is the code it was
    computed from, else computed and cached. Once per process, as the registry modules would be imported once."""
    sources = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
    digest = hashlib.sha256()
    modules = []
    for path in sources:
        text = path.read_bytes()
        digest.update(f"{path.relative_to(ROOT)}\0{len(text)}\0".encode() + text)
        if b"Registry(" in text:  # a module that may build a registry (a wider net costs imports, not correctness)
            modules.append(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
    key = digest.hexdigest()
    try:
        cached = json.loads(CATALOG.read_text())
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    if key in cached:
        return cached[key]
    # With torch imported, importing the rest here is cheaper than a second interpreter importing it all again.
    registries = read_registries(modules) if "torch" in sys.modules else _read_apart(modules)
    kept = list(cached.items())[:KEPT]  # newest first
    try:
        with atomic_output(CATALOG, with_the_stage=False) as temporary:
            temporary.write_text(json.dumps({key: registries, **dict(kept)}))
    except OSError:
        pass  # a read-only home: computed again next time
    return registries


def read_registries(modules: list[str]) -> Catalog:
    """Import ``modules`` and read every registry they hold: names in registration order, and each entry's
    metadata as JSON gives it back, whichever process read it (a test compares it with the registries)."""
    from tasks.common.registry_type import Registry

    found: Catalog = {}
    for module in modules:
        for name, value in vars(importlib.import_module(module)).items():
            if isinstance(value, Registry):
                found[f"{module}:{name}"] = {entry: dict(registered.metadata) for entry, registered in value.items()}
    return json.loads(json.dumps(found))


def _read_apart(modules: list[str]) -> Catalog:
    result = subprocess.run(
        [sys.executable, "-c", _COMPUTE, str(ROOT), *modules], capture_output=True, text=True, check=False
    )
    if result.returncode:
        raise RuntimeError(f"reading the registries of {', '.join(modules)} failed:\n{result.stderr.strip()}")
    return json.loads(result.stdout.splitlines()[-1])
