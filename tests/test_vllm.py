"""The vLLM rollout backend agrees with the trainer, before and after an in-place weight sync.

One engine serves the module: starting vLLM takes about half a minute.
"""

import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from models import build_char_tokenizer, build_tiny_llama, load_policy, load_tokenizer
from tasks.algos.supervised import sft_loss
from tasks.algos.tokens import token_logprobs
from tasks.common.config import BaseConfig, VLLMConfig
from tasks.data.prompts import BARE, finished_response_ids
from tasks.rollout.engine import Sampling
from tasks.rollout.hf_engine import HFEngine
from tasks.rollout.vllm_engine import VLLMEngine
from tests.conftest import dvc, make_project

pytest.importorskip("vllm")  # tasks.rollout.vllm_engine imports it only when an engine is built

PROMPTS = ["12+34=", "7*8="]
RESPONSES = ["<think>2+4=6,1+3=4</think><answer>46</answer>", "<think>7*8=56</think><answer>56</answer>"]
# Longer than one KV block (128 tokens on CPU), so vLLM's prefix cache keeps its first block between calls.
LONG_PROMPT = "1234567890+9876543210=" * 7
TOLERANCE = 1e-3


def trainer_logprobs(model, tokenizer, prompts: list[str], completions: list[list[int]], temperature: float = 1.0):
    """log p(token) of each completion token from one full forward pass of the HF model."""
    rows = []
    with torch.no_grad():
        for prompt, completion in zip(prompts, completions, strict=True):
            ids = torch.tensor([tokenizer(prompt)["input_ids"] + completion])
            logits = model(input_ids=ids).logits / temperature
            rows.append(token_logprobs(logits[:, :-1], ids[:, 1:])[0, ids.shape[1] - 1 - len(completion) :].tolist())
    return rows


def max_difference(rows: list[list[float]], other: list[list[float]]) -> float:
    return max(
        abs(a - b) for row, other_row in zip(rows, other, strict=True) for a, b in zip(row, other_row, strict=True)
    )


def policy_update(model, tokenizer, steps: int = 10) -> None:
    """A few AdamW steps of SFT on the responses, enough to move every log-prob visibly."""
    batch = tokenizer([p + r + tokenizer.eos_token for p, r in zip(PROMPTS, RESPONSES, strict=True)], padding=True)
    input_ids, attention_mask = torch.tensor(batch["input_ids"]), torch.tensor(batch["attention_mask"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = sft_loss(model(input_ids=input_ids, attention_mask=attention_mask).logits, input_ids, attention_mask)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


@pytest.fixture(scope="module")
def synced(tmp_path_factory) -> SimpleNamespace:
    """An engine on a tiny model, its log-probs of fixed completions, then a policy update synced into it.

    The long prompt is rolled out before the update so that stale KV sits in the prefix cache at the sync.
    """
    path = tmp_path_factory.mktemp("tiny")
    tokenizer = build_char_tokenizer()
    # head_dim 32: the smallest head size vLLM's CPU attention supports.
    config = BaseConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_position_embeddings=256)
    build_tiny_llama(config, tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    tokenizer, policy = load_tokenizer(path), load_policy(path, torch.device("cpu"))
    completions = [finished_response_ids(tokenizer, r) for r in RESPONSES]

    engine = VLLMEngine(path, 0, 256, BARE, settings=VLLMConfig(enforce_eager=True))  # starts in seconds
    run = SimpleNamespace(engine=engine, policy=policy, tokenizer=tokenizer, completions=completions)
    run.vllm_before = engine.completion_logprobs(PROMPTS, completions)
    run.trainer_before = trainer_logprobs(policy, tokenizer, PROMPTS, completions)
    engine.generate([LONG_PROMPT], Sampling(1))
    policy_update(policy, tokenizer)
    engine.sync_weights(policy)
    return run


def test_engine_serves_the_saved_model(synced):
    assert max_difference(synced.vllm_before, synced.trainer_before) < TOLERANCE


def test_sync_weights_makes_vllm_logprobs_match_the_updated_trainer(synced):
    trainer_after = trainer_logprobs(synced.policy, synced.tokenizer, PROMPTS, synced.completions)
    vllm_after = synced.engine.completion_logprobs(PROMPTS, synced.completions)
    assert max_difference(vllm_after, trainer_after) < TOLERANCE
    # The update moved the log-probs far beyond the tolerance, so a no-op sync would have failed above.
    assert max_difference(trainer_after, synced.trainer_before) > 100 * TOLERANCE


def test_sampled_completions_are_well_formed_and_carry_the_trainers_logprobs(synced):
    # The long prompt's log-probs would be off if its pre-update KV were reused from the prefix cache.
    prompts, tokenizer, max_new_tokens, n, temperature = [*PROMPTS, LONG_PROMPT], synced.tokenizer, 24, 3, 0.7
    completions = synced.engine.generate(prompts, Sampling(max_new_tokens, n=n, temperature=temperature))
    assert [c.prompt_index for c in completions] == [i for i in range(len(prompts)) for _ in range(n)]
    for c in completions:
        assert 0 < len(c.token_ids) <= max_new_tokens and len(c.logprobs) == len(c.token_ids)
        assert tokenizer.eos_token_id not in c.token_ids[:-1]
        assert c.token_ids[-1] == tokenizer.eos_token_id or len(c.token_ids) == max_new_tokens
        assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
    expected = trainer_logprobs(
        synced.policy,
        tokenizer,
        [prompts[c.prompt_index] for c in completions],
        [c.token_ids for c in completions],
        temperature,
    )
    assert max_difference([c.logprobs for c in completions], expected) < TOLERANCE


def test_greedy_completions_equal_hf_generate(synced):
    prompts, sampling = [*PROMPTS, LONG_PROMPT], Sampling(24, greedy=True)
    hf = HFEngine(synced.policy, synced.tokenizer, len(prompts), BARE).generate(prompts, sampling)
    vllm = synced.engine.generate(prompts, sampling)
    assert [c.token_ids for c in vllm] == [c.token_ids for c in hf]
    assert [c.text for c in vllm] == [c.text for c in hf]
    assert max_difference([c.logprobs for c in vllm], [c.logprobs for c in hf]) < TOLERANCE


@pytest.mark.slow
def test_grpo_on_a_bf16_vllm_engine_beside_an_fp32_trainer_is_corrected_stable_and_plots_the_mismatch(tmp_path):
    kl_budget = 8.0
    project = make_project(
        tmp_path / "project",
        (
            "base.hidden_size=64",  # head size 32: the smallest vLLM's CPU attention takes
            "base.intermediate_size=128",
            "grpo.rollout_backend=vllm",
            "grpo.vllm.dtype=bf16",
            "grpo.vllm.enforce_eager=true",
            "grpo.steps=3",
            f"grpo.kl_budget={kl_budget}",
        ),
    )
    dvc(project, "repro", "grpo")
    plots = project / "metrics/grpo/plots/metrics/train"
    curves = {name: _column(plots / f"{name}.tsv") for name in ("mismatch_kl", "is_weight", "kl", "policy_loss")}
    assert all(len(curve) == 3 and all(math.isfinite(v) for v in curve) for curve in curves.values()), curves
    assert all(v > 0 for v in curves["mismatch_kl"])  # a bfloat16 engine does not sample the trainer's policy
    assert all(0 < v <= 2.0 for v in curves["is_weight"])  # auto weighs each token, truncated at weight_cap
    assert max(curves["kl"]) < kl_budget
    shown = dvc(project, "plots", "show", "--json")
    assert "train/mismatch_kl.tsv" in shown and "train/is_weight.tsv" in shown
    weights = load_file(project / "artifacts/grpo/model.safetensors")
    assert all(torch.isfinite(tensor).all() for tensor in weights.values())


def _column(path) -> list[float]:
    """The values of a dvclive plot's .tsv (columns: timestamp, step, value)."""
    return [float(line.split("\t")[-1]) for line in path.read_text().splitlines()[1:]]
