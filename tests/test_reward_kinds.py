"""Reward-model kinds against reference computations: each kind's score of a (prompt, response), batched and padded
by ``RewardModel``, equals the number computed row by row, unpadded, from its definition."""

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from models import load_tokenizer
from tasks.algos.reward_models import REWARD_ENSEMBLES
from tasks.common.config import Params, RewardModelConfig
from tasks.common.training import Checkpointer
from tasks.data.datasets import PreferencePair
from tasks.data.prompts import BARE
from tasks.rl.reward_kinds import REFERENCE_DIR, REWARD_KINDS, Frozen, RewardModel, Scoring, pack_scored, verdict_id
from tasks.stages.reward_model import scoring_rule, train_member
from tests.conftest import tiny_model

CPU = torch.device("cpu")
PROMPTS = ["12+30=", "7*8=", "123-45="]
RESPONSES = ["<think>2+0=2</think><answer>42</answer>", "<answer>56</answer>", "<think>x</think><answer>7"]


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("backbone"))


def _reward_model(tmp_path, backbone, scoring: Scoring, member_class=None):
    """A reward model directory as the stage writes it: member-0 (the backbone, or its classifier), scoring.json."""
    root = tmp_path / "reward_model"
    if member_class is None:
        shutil.copytree(backbone, root / "member-0")
    else:
        torch.manual_seed(0)
        member_class.from_pretrained(backbone, num_labels=1).save_pretrained(root / "member-0")
        load_tokenizer(backbone).save_pretrained(root / "member-0")
    scoring.save(root)
    return root


def _response_logprobs(model, tokenizer, prompt: str, ids: list[int]) -> torch.Tensor:
    """log p of each of ``ids`` after ``prompt``, from one unpadded forward pass."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0].float()
    positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(ids))
    return torch.log_softmax(logits[positions], -1)[torch.arange(len(ids)), torch.tensor(ids)]


def _finished(tokenizer, response: str) -> list[int]:
    return tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def _scores(root) -> torch.Tensor:
    return RewardModel(root / "member-0", CPU).score_texts(BARE, PROMPTS, RESPONSES, batch_size=2)


def test_likelihood_is_the_mean_token_logprob_of_the_finished_response(tmp_path, backbone):
    model, tokenizer = AutoModelForCausalLM.from_pretrained(backbone), load_tokenizer(backbone)
    pairs = zip(PROMPTS, RESPONSES, strict=True)
    expected = [_response_logprobs(model, tokenizer, p, _finished(tokenizer, r)).mean() for p, r in pairs]
    scores = _scores(_reward_model(tmp_path, backbone, Scoring("likelihood")))
    torch.testing.assert_close(scores, torch.stack(expected), rtol=0, atol=1e-5)


def test_simpo_is_beta_times_the_likelihood(tmp_path, backbone):
    likelihood = _scores(_reward_model(tmp_path / "a", backbone, Scoring("likelihood")))
    simpo = _scores(_reward_model(tmp_path / "b", backbone, Scoring("simpo", beta=2.5)))
    torch.testing.assert_close(simpo, 2.5 * likelihood)


def test_generative_is_the_logprob_of_the_verdict_after_the_question(tmp_path, backbone):
    model, tokenizer = AutoModelForCausalLM.from_pretrained(backbone), load_tokenizer(backbone)
    scoring = Scoring("generative", verdict_suffix="\nOK? ", verdict_token="Y")
    question = tokenizer("\nOK? ", add_special_tokens=False)["input_ids"]
    verdict = tokenizer("Y", add_special_tokens=False)["input_ids"]
    expected = [
        _response_logprobs(model, tokenizer, p, _finished(tokenizer, r) + question + verdict)[-1]
        for p, r in zip(PROMPTS, RESPONSES, strict=True)
    ]
    torch.testing.assert_close(
        _scores(_reward_model(tmp_path, backbone, scoring)), torch.stack(expected), atol=1e-5, rtol=0
    )


def test_implicit_is_beta_log_ratio_to_the_reference_summed_over_the_response(tmp_path, backbone):
    root = _reward_model(tmp_path, backbone, Scoring("implicit", beta=0.1))
    reference = AutoModelForCausalLM.from_pretrained(backbone)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    reference.save_pretrained(root / REFERENCE_DIR)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(backbone), load_tokenizer(backbone)
    expected = [
        0.1 * (_response_logprobs(model, tokenizer, p, ids) - _response_logprobs(reference, tokenizer, p, ids)).sum()
        for p, ids in ((p, _finished(tokenizer, r)) for p, r in zip(PROMPTS, RESPONSES, strict=True))
    ]
    scores = _scores(root)
    assert scores.abs().max() > 1e-3  # the reference differs, so the scores are not all zero
    torch.testing.assert_close(scores, torch.stack(expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["classifier", "grm"])
def test_scalar_head_kinds_read_the_score_where_transformers_pools_it(tmp_path, backbone, kind):
    root = _reward_model(tmp_path, backbone, Scoring(kind), AutoModelForSequenceClassification)
    classifier, tokenizer = (
        AutoModelForSequenceClassification.from_pretrained(root / "member-0"),
        load_tokenizer(backbone),
    )
    expected = []
    for prompt, response in zip(PROMPTS, RESPONSES, strict=True):
        ids = tokenizer(prompt)["input_ids"] + _finished(tokenizer, response)
        with torch.no_grad():
            expected.append(classifier(torch.tensor([ids])).logits[0, 0])
    torch.testing.assert_close(_scores(root), torch.stack(expected), atol=1e-5, rtol=0)


def test_grm_reads_the_backbones_lm_head_off_the_classifiers_hidden_states(backbone):
    """Before training, the classifier's trunk is the backbone's: its LM log-probs through the frozen LM head are the
    causal LM's own, the text the LM loss keeps the hidden states predicting."""
    torch.manual_seed(0)
    classifier = AutoModelForSequenceClassification.from_pretrained(backbone, num_labels=1)
    causal, tokenizer = AutoModelForCausalLM.from_pretrained(backbone), load_tokenizer(backbone)
    frozen = Frozen(Scoring("grm"), lm_head=causal.get_output_embeddings().weight.detach())
    finished = [_finished(tokenizer, r) for r in RESPONSES]
    batch, mask = pack_scored(tokenizer, frozen.scoring, [tokenizer(p)["input_ids"] for p in PROMPTS], finished)
    with torch.no_grad():
        out = REWARD_KINDS["grm"](classifier, batch, mask, frozen)
    for row, (prompt, ids) in enumerate(zip(PROMPTS, finished, strict=True)):
        expected = _response_logprobs(causal, tokenizer, prompt, ids)
        torch.testing.assert_close(out.lm_logprobs[row, : len(ids)], expected, atol=1e-5, rtol=0)


def test_a_verdict_of_several_tokens_is_refused_naming_the_key(backbone):
    tokenizer = load_tokenizer(backbone)
    assert verdict_id(tokenizer, Scoring("generative", "?", "Y")) == tokenizer.convert_tokens_to_ids("Y")
    with pytest.raises(ValueError, match=r"reward_model.verdict_token: 'Yes' is 3 tokens"):
        verdict_id(tokenizer, Scoring("generative", "?", "Yes"))


def test_ensemble_rules_match_their_definitions():
    scores = torch.tensor([[1.0, -2.0, 0.5], [3.0, 0.0, 0.5], [2.0, 1.0, 0.5]])  # 3 members, 3 responses
    mean, std = scores.mean(0), scores.std(0, correction=0)
    torch.testing.assert_close(REWARD_ENSEMBLES["mean"](scores, 1.0), mean)
    torch.testing.assert_close(REWARD_ENSEMBLES["min"](scores, 1.0), torch.tensor([1.0, -2.0, 0.5]))
    torch.testing.assert_close(REWARD_ENSEMBLES["mean_minus_std"](scores, 0.5), mean - 0.5 * std)
    # agreeing members cost nothing; one member is its own mean
    assert REWARD_ENSEMBLES["mean_minus_std"](scores, 3.0)[2] == 0.5
    torch.testing.assert_close(REWARD_ENSEMBLES["mean_minus_std"](scores[:1], 2.0), scores[0])


@pytest.mark.parametrize("kind", ["simpo", "classifier", "grm", "generative"])
def test_each_trained_kind_learns_to_rank_the_pairs(tmp_path, backbone, monkeypatch, kind):
    """A few steps of each kind's loss on pairs a random tiny model cannot rank (a worked solution against the same
    characters reversed) leave a member, loadable by its consumers, that ranks them."""
    monkeypatch.chdir(tmp_path)  # the checkpoints live under the project directory
    pairs = []
    for a, b in [(12, 30), (7, 8), (45, 23), (9, 91), (33, 3), (60, 17), (5, 55), (21, 12)]:
        solution = f"<think>{a}+{b}={a + b}</think><answer>{a + b}</answer>"
        pairs.append(PreferencePair(f"{a}+{b}=", solution, solution[::-1]))
    cfg = RewardModelConfig(kind=kind, backbone="sft", lr=3e-3, batch_size=8, epochs=30, warmup_steps=1, log_every=5)
    root, params = tmp_path / "reward_model", Params(seed=0, device="cpu")
    root.mkdir()
    scoring_rule(params, cfg).save(root)
    checkpointer = Checkpointer("reward_model", {"kind": kind}, [])
    history = train_member(params, cfg, backbone, 0, pairs, root / "member-0", checkpointer)
    checkpointer.clear()
    assert history[-1][1]["loss"] < history[0][1]["loss"]
    assert ("lm_loss" in history[-1][1]) == REWARD_KINDS[kind].lm_loss
    scores = RewardModel(root / "member-0", CPU).score_texts(
        BARE, [p.prompt for p in pairs] * 2, [p.chosen for p in pairs] + [p.rejected for p in pairs], 16
    )
    assert (scores[: len(pairs)] > scores[len(pairs) :]).float().mean() >= 0.875
