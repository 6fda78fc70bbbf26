"""dvc.yaml tells the truth: every stage lists the code it runs, and the stage registry agrees with it.

``dvc.lock`` vouches for an artifact only as far as dvc.yaml's deps reach: a module a stage imports
but does not list could change without DVC noticing, and the artifact would stay "up to date".
"""

import json
import re
import subprocess
import sys

import networkx as nx
import pytest
from dvc.repo import Repo

from flows.fingerprints import SOURCES_STAGE, fingerprinted
from flows.generate import generated, stale
from flows.imports import has_code, transitive_imports
from flows.registry import check_artifact_path
from tasks.common.artifacts import stage_dir
from tasks.common.config import ConfigError
from tasks.common.registry import parse_stage_name, read_artifacts
from tasks.kinds import stage_kinds
from tasks.params.load import load_params
from tasks.pipelines import PIPELINES, kinds_run
from tests.conftest import ENV, REPO, make_project

_COMMAND = re.compile(r"alignflow stage (\S+)")


@pytest.fixture(scope="module")
def all_dvc_stages() -> list:
    """Every stage of the repo's dvc.yaml, foreach groups expanded, as DVC itself resolves them."""
    with Repo(str(REPO)) as repo:
        return list(repo.index.stages)


@pytest.fixture(scope="module")
def dvc_stages(all_dvc_stages) -> list:
    """The stages that run a stage kind: all but ``sources``."""
    return [stage for stage in all_dvc_stages if stage.addressing.rpartition(":")[2] != SOURCES_STAGE]


def test_the_sources_stage_writes_every_fingerprint_a_stage_reads_and_runs_on_every_repro(all_dvc_stages):
    (sources,) = [stage for stage in all_dvc_stages if stage.addressing.rpartition(":")[2] == SOURCES_STAGE]
    assert sources.always_changed and sources.cmd == "alignflow fingerprints"
    written = {out.def_path for out in sources.outs}
    assert all(not out.use_cache and out.persist for out in sources.outs)
    read = {dep.def_path for stage in all_dvc_stages for dep in stage.deps if dep.def_path.startswith("sources/")}
    assert read == written == {file for file, _ in fingerprinted()}


def _stage_name(stage) -> str:
    return _COMMAND.fullmatch(stage.cmd).group(1)


def test_every_stage_runs_an_alignflow_stage_of_a_registered_kind(dvc_stages):
    kinds_in_dvc = {parse_stage_name(_stage_name(stage))[0].name for stage in dvc_stages}
    assert kinds_in_dvc == set(stage_kinds())


@pytest.mark.slow
def test_every_module_a_stage_imports_is_among_its_deps(dvc_stages):
    missing = {}
    for stage in dvc_stages:
        kind, _ = parse_stage_name(_stage_name(stage))
        deps = [REPO / dep.def_path for dep in stage.deps]
        imported = transitive_imports(kind.entry.partition(":")[0])
        # The stage kinds' declarations are what dvc.yaml is written from: a change there shows in dvc.yaml itself.
        declarations = {REPO / "tasks/kinds.py"}
        uncovered = [
            str(path.relative_to(REPO))
            for path in imported.values()
            if has_code(path)
            and path not in declarations
            and not any(path == dep or dep in path.parents for dep in deps)
        ]
        if uncovered:
            missing[stage.addressing] = uncovered
    assert not missing, f"modules imported but not in dvc.yaml deps: {missing}"


@pytest.mark.slow
def test_dvc_yaml_and_params_yaml_are_written_from_the_declarations(tmp_path):
    """`alignflow generate --check` passes on the repo, and names a file that has drifted from the declarations."""
    assert stale(REPO) == []
    project = make_project(tmp_path)  # its params shrunk: generate writes them in the file's canonical form
    for path, text in generated(project).items():
        path.write_text(text)
    assert stale(project) == []
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("      - tasks/stages/sft.py\n", "", 1))
    params_yaml = project / "params.yaml"
    params_yaml.write_text(params_yaml.read_text().replace("  lr: 0.002\n", "  lr: 0.002  # mine\n", 1))
    assert stale(project) == [dvc_yaml, params_yaml]


def test_the_checker_sees_lazy_imports_and_package_parents():
    imported = transitive_imports("tasks.rl.trainer")
    assert "tasks.rollout.vllm_engine" in imported  # imported inside a function, only for rollout_backend=vllm
    assert {"tasks", "tasks.rl", "tasks.data.problems.countdown"} <= set(imported)
    assert not has_code(imported["tasks.rl"]) and has_code(imported["tasks.data.problems"])


def test_the_registry_reads_and_writes_what_dvc_yaml_declares(dvc_stages):
    params = load_params(REPO / "params.yaml")
    for stage in dvc_stages:
        name = _stage_name(stage)
        kind, target = parse_stage_name(name)
        reads = read_artifacts(kind, params, target).values()
        declared = {dep.def_path for dep in stage.deps if dep.def_path.startswith("artifacts/")}
        assert declared == {str(stage_dir(read)) for read in reads}, name
        assert str(stage_dir(name)) in {out.def_path for out in stage.outs}, name


def test_every_pipeline_ends_in_stages_of_dvc_yaml(dvc_stages):
    names = {stage.addressing.rpartition(":")[2] for stage in dvc_stages}
    groups = {name.partition("@")[0] for name in names}
    params = load_params(REPO / "params.yaml", ["distill.teacher=grpo_final/1"])
    for pipeline in PIPELINES.values():
        assert set(pipeline.stages(params)) <= names | groups
    assert "eval_grpo_final@1" in PIPELINES["distill"].stages(params)  # the teacher's evaluation follows the key


def test_the_kinds_a_pipeline_runs_are_those_dvc_runs_for_it(all_dvc_stages):
    """Validation checks the sections of what a command runs (kinds_run, from the declarations): DVC's own graph
    of dvc.yaml must agree on what that is, for every pipeline."""
    with Repo(str(REPO)) as repo:
        graph = repo.index.graph  # an edge from each stage to a stage it depends on
        by_name = {stage.addressing.rpartition(":")[2]: stage for stage in graph.nodes}
        params = load_params(REPO / "params.yaml")
        for name, pipeline in PIPELINES.items():
            finals = [s for t in pipeline.stages(params) for n, s in by_name.items() if t in (n, n.partition("@")[0])]
            upstream = set(finals).union(*(nx.descendants(graph, stage) for stage in finals))
            kinds = {parse_stage_name(_stage_name(s))[0].name for s in upstream if s.cmd.startswith("alignflow stage")}
            assert kinds_run([name], params) == kinds, name


def test_every_pipeline_registers_the_model_it_trains(dvc_stages):
    params = load_params(REPO / "params.yaml")
    outputs = {out.def_path for stage in dvc_stages for out in stage.outs}
    for name in PIPELINES:
        path = check_artifact_path(REPO, name, params)  # raises naming the artifacts entry when it is not
        assert str(path) in outputs, name
    with pytest.raises(ConfigError, match="artifacts.r1.path must be 'artifacts/grpo_final/2'"):
        check_artifact_path(
            REPO, "r1", load_params(REPO / "params.yaml", ["rounds={'1': {policy: grpo}, '2': {policy: grpo_final/1}}"])
        )


@pytest.mark.slow
def test_editing_the_verifier_marks_every_stage_that_scores_with_it_changed(tmp_path, monkeypatch):
    """Record every stage as done (stand-in outputs, `dvc commit`), edit countdown's verifier: DVC must see it."""
    project = make_project(tmp_path)
    monkeypatch.chdir(project)  # DVC resolves stage paths against the working directory
    with Repo(str(project)) as repo:
        for stage in repo.index.stages:
            for out in stage.outs:
                path = project / out.def_path
                if path.is_file():  # the fingerprints, which the project holds
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.suffix == ".json":
                    path.write_text("{}")
                else:
                    path.mkdir(exist_ok=True)
                    (path / "placeholder").write_text(out.def_path)
        repo.commit(force=True)
        names = {_stage_name(stage) for stage in repo.index.stages if stage.cmd != "alignflow fingerprints"}
    assert _changed(project) == set()

    verifier = project / "tasks/data/problems/countdown.py"
    verifier.write_text(verifier.read_text() + "\n_UNUSED = None\n")
    changed = _changed(project)
    # every stage but the two that build a model from its size reads problems through their checks
    scoring = {name for name in names if name not in ("base", "student_base", "agent_base")}
    assert changed == scoring
    assert {"grpo", "grpo_zero", "rejection@1", "grpo_final@1", "ppo"} <= changed
    assert {name for name in names if name.startswith("eval@")} <= changed


def _changed(project) -> set[str]:
    """The stages `dvc status` reports as changed, by their alignflow stage names."""
    result = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"], cwd=project, env=ENV, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status.pop(SOURCES_STAGE) == ["always changed"]  # run on every repro: what it writes decides the rest
    with Repo(str(project)) as repo:
        by_address = {
            stage.addressing: _stage_name(stage) for stage in repo.index.stages if stage.cmd != "alignflow fingerprints"
        }
    return {by_address[address] for address in status}


def test_a_stage_named_like_a_pipeline_is_the_stage_when_a_command_runs_a_stage():
    params = load_params(REPO / "params.yaml")
    assert kinds_run(["sft"], params) == {"data", "base", "sft", "eval"}  # `alignflow repro sft`: the pipeline
    assert kinds_run(["sft"], params, as_stages=True) == {"data", "base", "sft"}  # `alignflow stage sft`
    assert "eval" not in kinds_run(["distill"], params, as_stages=True)
