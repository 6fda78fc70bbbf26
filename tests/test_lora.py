"""LoRA adapters and precision on the tiny model: the reference is the base inside the policy, the artifact the
merged model, a killed adapted run resumes to the same bits, and bf16 trains on a CPU."""

import subprocess
from dataclasses import replace

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from models import load_reference, load_tokenizer
from models.trainable import ADAPTER_DIR, is_adapted, merged_state_dict
from tasks.common.config import LoraConfig, Params
from tasks.common.training import make_deterministic
from tasks.data.prompts import BARE
from tasks.rl.placement import placed
from tasks.rl.role_handles import AdapterReference
from tasks.rl.sequences import pack_text, response_logprobs
from tasks.rl.workers import CriticWorker
from tests.conftest import kill_at_first_checkpoint, make_project, tiny_model, warm

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))
PROMPTS, RESPONSES = ["1+2=", "98-7=", "12*3="], ["<think>1+2=3</think><answer>3</answer>", "91", "<answer>36"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("lora_model"))


def _trained_actor(roles, batch):
    """The actor after its adapters have moved away from zero (B starts at zero: the adapted model is the base)."""
    model = roles.actor.local.model
    assert is_adapted(model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    return model


def test_the_reference_of_an_adapted_policy_is_its_base_with_adapters_disabled(model_dir, one_thread):
    make_deterministic(0)
    cfg = replace(Params().grpo, lora=LORA, kl_loss="k3", colocate=True)
    batch = pack_text(load_tokenizer(model_dir), BARE, PROMPTS, RESPONSES)
    with placed(Params(seed=0, device="cpu"), cfg, model_dir, [], {"reference"}) as roles:
        assert isinstance(roles.reference, AdapterReference)  # no second copy of the model
        model = _trained_actor(roles, batch)
        adapted = roles.actor.logprobs(batch).result()
        reference = roles.reference.logprobs(batch).result()
        trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    base = response_logprobs(load_reference(model_dir, torch.device("cpu")), batch, cfg.temperature)
    mask = batch.response_mask.bool()
    assert (reference - base)[mask].abs().max() <= 1e-6
    assert (adapted - base)[mask].abs().max() > 1e-3  # the adapters do change the policy
    assert trainable and all("lora_" in name for name in trainable)


def test_an_adapted_actors_engine_samples_from_the_merged_weights_after_every_update(model_dir, one_thread):
    """The engine in the actor's process samples from a plain copy with the adapters merged in (no PEFT layers in
    the sampling loop), refreshed at each sync; a resume state carries no copy of it (made again on loading)."""
    make_deterministic(0)
    cfg = replace(Params().grpo, lora=LORA, kl_loss="none", colocate=True, group_size=3, minibatch_size=3)
    batch = pack_text(load_tokenizer(model_dir), BARE, PROMPTS, RESPONSES)
    with placed(Params(seed=0, device="cpu"), cfg, model_dir, [], set()) as roles:
        actor = roles.actor.local
        assert actor.sampler is not actor.model and not is_adapted(actor.sampler)
        model = _trained_actor(roles, batch)
        actor._took_steps(1)  # the sync after an update
        merged = merged_state_dict(model)
        for name, tensor in actor.sampler.state_dict().items():
            assert torch.equal(tensor, merged[name]), name
        sampled = response_logprobs(actor.sampler, batch, cfg.temperature)
        adapted = roles.actor.logprobs(batch).result()
        assert (sampled - adapted)[batch.response_mask.bool()].abs().max() <= 1e-5
        assert actor.state()["sampler"] is None


def test_the_saved_artifact_is_the_merged_model_with_the_adapter_beside_it(model_dir, tmp_path, one_thread):
    make_deterministic(0)
    cfg = replace(Params().grpo, lora=LORA, colocate=True)
    batch = pack_text(load_tokenizer(model_dir), BARE, PROMPTS, RESPONSES)
    with placed(Params(seed=0, device="cpu"), cfg, model_dir, [], set()) as roles:
        model = _trained_actor(roles, batch)
        roles.actor.save(tmp_path / "out", model_dir).result()
        with torch.no_grad():
            adapted = model(**batch.model_inputs()).logits
        for_engines = merged_state_dict(model)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    with torch.no_grad():
        assert (merged(**batch.model_inputs()).logits - adapted).abs().max() <= 1e-5
        # the adapter alone, on the model the stage started from, is the same model
        reloaded = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(model_dir), tmp_path / "out" / "adapter"
        )
        assert (reloaded(**batch.model_inputs()).logits - adapted).abs().max() <= 1e-5
    assert set(for_engines) == set(merged.state_dict())  # what the engines load: the plain model's names
    assert (tmp_path / "out" / ADAPTER_DIR / "adapter_config.json").is_file()
    assert str(tmp_path) not in (tmp_path / "out" / ADAPTER_DIR / "adapter_config.json").read_text()


@pytest.mark.slow
def test_an_adapted_bf16_mixed_sft_killed_mid_run_resumes_to_identical_weights(tmp_path):
    overrides = ("sft.lora.rank=4", "sft.precision=bf16-mixed", "sft.save_every=5", "sft.max_steps=30")
    whole = make_project(tmp_path, overrides)
    for stage in ("data", "base", "sft"):
        subprocess.run(["alignflow", "stage", stage], cwd=whole, env=warm(), check=True, capture_output=True)
    expected = load_file(whole / "artifacts/sft/model.safetensors")
    adapter = load_file(whole / "artifacts/sft/adapter/adapter_model.safetensors")

    checkpoints = whole / ".alignflow/checkpoints/sft"
    kill_at_first_checkpoint(["alignflow", "stage", "sft"], whole, checkpoints)
    resumed = subprocess.run(["alignflow", "stage", "sft"], cwd=whole, env=warm(), capture_output=True, text=True)
    assert resumed.returncode == 0 and "resuming from the checkpoint at step 5" in resumed.stdout + resumed.stderr
    again = load_file(whole / "artifacts/sft/model.safetensors")
    assert all(torch.equal(expected[name], again[name]) for name in expected)
    assert all(
        torch.equal(adapter[name], tensor)
        for name, tensor in load_file(whole / "artifacts/sft/adapter/adapter_model.safetensors").items()
    )
    assert all(tensor.dtype == torch.float32 for tensor in expected.values())  # mixed: float32 weights
    metrics = (whole / "metrics/sft/metrics.json").read_text()
    assert "NaN" not in metrics and "Infinity" not in metrics


def test_bf16_weights_train_on_a_cpu(model_dir, one_thread):
    make_deterministic(0)
    cfg = replace(Params().grpo, precision="bf16", actor_lr=1e-2, warmup_steps=0, colocate=True)
    batch = pack_text(load_tokenizer(model_dir), BARE, PROMPTS, RESPONSES)
    with placed(Params(seed=0, device="cpu"), cfg, model_dir, [], set()) as roles:
        actor = roles.actor.local
        assert next(actor.model.parameters()).dtype == torch.bfloat16
        before = actor.logprobs(batch)
        for _ in range(5):
            logprobs = response_logprobs(actor.model, batch, 1.0)
            loss = -(logprobs * batch.response_mask).sum() / batch.response_mask.sum()
            actor._step(loss, cfg, "a bf16 step")
        after = actor.logprobs(batch)
    mask = batch.response_mask.bool()
    assert torch.isfinite(after).all() and after[mask].mean() > before[mask].mean() + 0.1  # it learned the responses


def test_a_critic_trains_as_the_actor_does_through_adapters_in_its_precision(model_dir, one_thread):
    """PPO's critic with the stage's LoRA settings: only its adapters and value head train, its values come under
    bf16 autocast, and an update moves them toward the returns; without adapters it trains whole, as before."""
    make_deterministic(0)
    batch = pack_text(load_tokenizer(model_dir), BARE, PROMPTS, RESPONSES)
    returns = torch.ones(batch.response_mask.shape) * batch.response_mask
    for lora, precision in ((LORA, "bf16-mixed"), (LoraConfig(), "fp32")):
        cfg = replace(Params().ppo, lora=lora, precision=precision, minibatch_size=3, critic_lr=1e-2)
        critic = CriticWorker(Params(seed=0, device="cpu"), cfg, model_dir)
        trainable = {name for name, p in critic.model.named_parameters() if p.requires_grad}
        if lora.rank:
            assert trainable and all("lora_" in name or "score" in name for name in trainable)
            assert any("score" in name for name in trainable)
        else:
            assert trainable == {name for name, _ in critic.model.named_parameters()}
        before = critic.values(batch)
        for _ in range(3):
            critic.update(batch, before, returns)
        after = critic.values(batch)
        mask = batch.response_mask.bool()
        assert torch.isfinite(after).all()
        assert (after - returns)[mask].abs().mean() < (before - returns)[mask].abs().mean()
