"""The shape of the code base: no import loops, each layer importing only itself and the layers below it, and no
reliance on another library's private names outside the one adapter module per library that pins its version.

Imports are read from the source (every ``import`` and ``from ... import``, deferred ones inside functions too),
so a loop held together by a deferred import is still a loop.
"""

import ast
import importlib.metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Bottom to top: a module may import its own layer and the layers below it. Inside tasks: the stage kinds table,
# the shared library, the pipelines' catalog, the data, the engines, RL, the stages, and params loading (whose rules
# read every layer below it).
LAYERS = (
    "models",
    "tasks.kinds",
    "tasks.common",
    "tasks.algos",
    "tasks.pipelines",
    "tasks.data",
    "tasks.rollout",
    "tasks.rl",
    "tasks.stages",
    "tasks.params",
    "flows",
    "bench",
)
OWN = ("models", "tasks", "flows", "bench", "tests", "examples")
# The one adapter per library allowed a private name of it: library -> (module path, the adapter's module).
ADAPTERS = {
    "prefect": ("flows/prefect_internals.py", "flows.prefect_internals"),
    "dvclive": ("tasks/common/dvclive_internals.py", "tasks.common.dvclive_internals"),
}


def _modules(packages: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def _imported(tree: ast.AST) -> list[tuple[str, list[str], int]]:
    """(module, names, line) of every absolute import in ``tree``, nested ones included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names], node.lineno))
    return found


def import_graph(packages: tuple[str, ...] = ("models", "tasks", "flows", "bench")) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from a.b import c`` is a.b.c when that is a module, else a.b)."""
    modules = _modules(packages)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        targets = set()
        for module, names, _ in _imported(ast.parse(path.read_text())):
            for target in [f"{module}.{imported}" for imported in names] or [module]:
                if (resolved := resolve(target)) is not None and resolved != name:
                    targets.add(resolved)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def layer_of(module: str) -> int:
    return max(i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(f"{layer}."))


def test_cycle_finder_finds_a_loop_through_a_deferred_import_and_none_in_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    tree = ast.parse("def f():\n    from tasks.common import artifacts\n")
    assert _imported(tree) == [("tasks.common", ["artifacts"], 2)]


def test_the_project_has_no_import_loop():
    assert cycles(import_graph()) == []


def test_every_module_imports_only_its_own_layer_and_the_layers_below():
    upward = [
        f"{module} ({LAYERS[layer_of(module)]}) imports {target} ({LAYERS[layer_of(target)]})"
        for module, targets in import_graph().items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []
    assert layer_of("tasks.params.rules") > layer_of("tasks.stages.eval") > layer_of("tasks.common.artifacts")


def test_no_module_imports_a_private_name_of_another_package_outside_its_adapter():
    adapters = {path for path, _ in ADAPTERS.values()}
    found = []
    for name, path in _modules(OWN).items():
        relative = str(path.relative_to(ROOT))
        for module, names, line in _imported(ast.parse(path.read_text())):
            top = module.split(".")[0]
            if top == name.split(".")[0] or top == "__future__":
                continue
            private = [part for part in module.split(".") if part.startswith("_")]
            private += [imported for imported in names if imported.startswith("_")]
            if private and not (relative in adapters and ADAPTERS.get(top, ("",))[0] == relative):
                found.append(f"{relative}:{line}: {module} {', '.join(private)}")
    assert found == []


@pytest.mark.parametrize("library", sorted(ADAPTERS))
def test_each_adapter_is_pinned_to_the_installed_version(library):
    """An upgrade of the library fails here first: read the adapter's module against the new version, then move
    its pin."""
    adapter = importlib.import_module(ADAPTERS[library][1])
    assert importlib.metadata.version(library) == adapter.PINNED
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"{library}=={adapter.PINNED}"' in pyproject


def test_the_prefect_adapter_commits_and_clears_the_cancel_intent():
    from flows.prefect_internals import clear_intent, commit_cancel_intent, committed_intent

    commit_cancel_intent()
    try:
        assert committed_intent() == "cancel"
    finally:
        clear_intent()
    assert committed_intent() is None


def test_the_dvclive_adapter_closes_the_repository_live_opened(tmp_path, monkeypatch):
    from dvc.repo import Repo
    from dvclive import Live

    from tasks.common.dvclive_internals import close_repo, opened_repo

    monkeypatch.chdir(tmp_path)
    Repo.init(str(tmp_path), no_scm=True).close()
    live = Live("metrics", dvcyaml=None, save_dvc_exp=False, report=None)
    repo = opened_repo(live)
    assert repo is not None and Path(repo.root_dir) == tmp_path
    close_repo(live)
    live.end()


def _stages_depending_on(path: str) -> set[str]:
    import yaml

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name for name, stage in stages.items() if path in stage.get("do", stage).get("deps", [])}


def test_editing_an_rl_loss_reruns_only_the_stages_that_run_rl():
    """The policy-gradient losses' file is a code dependency of the RL stages alone, and the multi-turn episodes'
    of the stages that play them alone: SFT, the reward model and DPO share their math from tasks/algos."""
    from tasks.common.config import Params, RLConfig
    from tasks.common.config.fields import schema_fields
    from tasks.kinds import stage_kinds

    sections = schema_fields(Params)
    rl = {name for name, kind in stage_kinds().items() if issubclass(sections[kind.section].annotation, RLConfig)}
    assert _stages_depending_on("tasks/rl/core_algos.py") == rl
    assert "sft" not in _stages_depending_on("tasks/rollout/episodes.py")
