"""RLHF building blocks on a tiny random model: packing, engine log-probs, the gold judge, PPO helpers."""

import dataclasses
import random
import statistics
from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models import load_policy, load_tokenizer
from tasks.algos.tokens import token_logprobs
from tasks.common.config import RLConfig
from tasks.data.judge import gold_utility, prefers_first
from tasks.data.problems import Example
from tasks.data.prompts import BARE
from tasks.params.load import load_params
from tasks.rl.core_algos import POLICY_LOSSES, adaptive_kl_coef, explained_variance
from tasks.rl.guard import Guard, clearly_better, probe_split
from tasks.rl.learner import RunningMoments, prepare_scores
from tasks.rl.policy_gradient import policy_gradient_loss
from tasks.rl.sequences import (
    pack,
    pack_text,
    response_logprobs,
    response_logprobs_and_logits,
    shared_prompt_logits,
)
from tasks.rl.trainer import alarms
from tasks.rl.workers import ActorLoss, ActorWorker
from tasks.rollout.engine import Completion, Sampling
from tasks.rollout.hf_engine import HFEngine, policy_engine, sample_tokens
from tests.conftest import REPO, tiny_model

CPU = torch.device("cpu")
EXAMPLE = Example("arithmetic", "12+30=", "42", "<think>2+0+0=2,1+3+0=4</think><answer>42</answer>")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny"))


def test_trainer_logprobs_of_a_rollout_equal_the_engines(model_dir):
    """Left-padded prompts + right-padded responses, position ids over real tokens: the trainer's
    log-probs of the sampled tokens are the ones generate sampled them with (the HF engine's parity)."""
    torch.manual_seed(0)
    model, tokenizer = load_policy(model_dir, CPU), load_tokenizer(model_dir)
    prompts = ["1+2=", "123*4=", "98-7="]
    completions = HFEngine(model, tokenizer, 8, BARE).generate(prompts, Sampling(12, n=2, temperature=0.7))
    assert [c.prompt_index for c in completions] == [0, 0, 1, 1, 2, 2]
    batch = pack(
        [tokenizer(prompts[c.prompt_index])["input_ids"] for c in completions],
        [c.token_ids for c in completions],
        tokenizer.pad_token_id,
    )
    with torch.no_grad():
        logprobs = response_logprobs(model, batch, temperature=0.7)
    for row, completion in enumerate(completions):
        assert batch.response_ids[row, : len(completion.token_ids)].tolist() == completion.token_ids
        assert batch.response_mask[row].sum() == len(completion.token_ids)
        engine = torch.tensor(completion.logprobs)
        assert torch.allclose(logprobs[row, : len(engine)], engine, atol=1e-4)


def test_greedy_sampling_is_transformers_greedy_generate_token_for_token(model_dir):
    """The HF engine's own loop (one prefill per prompt copied to its n samples, ended rows leave the batch)
    decodes what ``generate`` decodes, for prompts of different lengths whose rows end at different steps."""
    model, tokenizer = load_policy(model_dir, CPU), load_tokenizer(model_dir)
    torch.manual_seed(1)
    with torch.no_grad():  # weights large enough that greedy continuations depend on the prompt
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    prompts = ["1+2=", "123*4=", "98-7=", "5=", "77+3="]
    greedy = Sampling(24, n=2, greedy=True)
    unended = [c.token_ids for c in HFEngine(model, tokenizer, 8, BARE).generate(prompts, greedy)]

    def ends(token: int) -> set[int]:
        return {ids.index(token) if token in ids else 24 for ids in unended}

    # A random model never says end-of-sequence: make one it says the end, so rows end at different steps.
    said = {token for ids in unended for token in ids}
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(max(sorted(said), key=lambda token: len(ends(token))))
    assert len(ends(tokenizer.eos_token_id)) >= 3
    completions = HFEngine(model, tokenizer, 3, BARE).generate(prompts, greedy)
    assert [c.prompt_index for c in completions] == [i for i in range(len(prompts)) for _ in range(2)]
    tokenizer.padding_side = "left"
    for completion in completions:
        inputs = tokenizer([prompts[completion.prompt_index]], return_tensors="pt")
        expected = model.generate(
            **inputs, max_new_tokens=24, do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=0
        )
        expected = expected[0, inputs["input_ids"].shape[1] :].tolist()
        if tokenizer.eos_token_id in expected:
            expected = expected[: expected.index(tokenizer.eos_token_id) + 1]
        assert completion.token_ids == expected
        assert completion.truncated == (tokenizer.eos_token_id not in expected)


def test_sampled_tokens_follow_the_distribution_and_never_take_a_zero_probability_one():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0], [0.1, 0.0, 0.0, 0.0, 0.0, 0.9]])
    torch.manual_seed(0)
    draws = torch.stack([sample_tokens(probs) for _ in range(20000)])  # (draws, rows)
    for row in range(len(probs)):
        frequencies = torch.bincount(draws[:, row], minlength=probs.shape[1]) / len(draws)
        assert (frequencies[probs[row] == 0] == 0).all()
        assert torch.allclose(frequencies, probs[row], atol=0.015), frequencies


# three distinct prompts over six rows: the grouped pass, each prompt computed once
SHARED_PROMPTS = ["1+2=", "123*4=", "1+2=", "98-7=", "123*4=", "1+2="]


def test_rows_sharing_a_prompt_give_the_numbers_and_gradients_of_one_pass_over_every_row(model_dir):
    model, tokenizer = load_policy(model_dir, CPU), load_tokenizer(model_dir)
    responses = ["<think>x</think>", "<a>1</a>", "9", "<answer>91</answer>", "<think>1</think>", "<a>33</a>"]
    batch = pack_text(tokenizer, BARE, SHARED_PROMPTS, responses)

    def logprobs_and_gradients(logits: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        logprobs = token_logprobs(logits.float(), batch.response_ids) * batch.response_mask
        return logprobs, torch.autograd.grad(logprobs.sum(), list(model.parameters()))

    shared, shared_gradients = logprobs_and_gradients(shared_prompt_logits(model, batch))
    every_row, gradients = logprobs_and_gradients(batch.response_logits(model(**batch.model_inputs()).logits))
    assert torch.allclose(shared, every_row, atol=1e-5)
    for ours, theirs in zip(shared_gradients, gradients, strict=True):
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("prompts", [SHARED_PROMPTS, ["1+2=", "123*4=", "98-7=", "5+5=", "7*8=", "9-1="]])
def test_log_probs_group_by_group_are_the_bits_and_gradients_of_the_whole_batchs_logits(model_dir, prompts):
    """response_logprobs never holds the batch's (B, T, V) logits at once, and gives what they give, bit for bit:
    with prompts shared (the grouped pass) and without (one pass over every row)."""
    model, tokenizer = load_policy(model_dir, CPU), load_tokenizer(model_dir)
    responses = ["<think>x</think>", "<a>1</a>", "9", "<answer>91</answer>", "<think>1</think>", "<a>33</a>"]
    batch = pack_text(tokenizer, BARE, prompts, responses)
    grouped = response_logprobs(model, batch, 0.7)
    whole, _ = response_logprobs_and_logits(model, batch, 0.7)
    assert torch.equal(grouped, whole)
    grouped_gradients = torch.autograd.grad((grouped * batch.response_mask).sum(), list(model.parameters()))
    whole_gradients = torch.autograd.grad((whole * batch.response_mask).sum(), list(model.parameters()))
    for ours, theirs in zip(grouped_gradients, whole_gradients, strict=True):
        assert torch.equal(ours, theirs)


def test_a_rows_numbers_do_not_depend_on_its_batchs_padding(model_dir):
    model, tokenizer = load_policy(model_dir, CPU), load_tokenizer(model_dir)
    alone = pack_text(tokenizer, BARE, ["1+2="], ["<think>x</think>"])
    padded = pack_text(tokenizer, BARE, ["1+2=", "123456*7="], ["<think>x</think>", "<think>a much longer one</think>"])
    with torch.no_grad():
        first = response_logprobs(model, alone, 1.0)
        second = response_logprobs(model, padded, 1.0)
    width = int(alone.response_mask.sum())
    assert torch.allclose(first[0, :width], second[0, :width], atol=1e-5)


def _policy_update(actor: ActorWorker, batch, old_logprobs, advantages):
    """The policy-gradient learner's update, without a KL term."""
    loss = ActorLoss(partial(policy_gradient_loss, kl_coef=0.0))
    return actor.update(batch, loss, {"advantages": advantages}, old_logprobs)


@pytest.mark.parametrize("policy_loss", sorted(POLICY_LOSSES))
def test_an_actor_update_moves_responses_toward_their_advantages(model_dir, policy_loss):
    """The trainer's sign and bookkeeping end to end, for every registered loss: after one update on sampled
    responses, those with a positive advantage gain log-probability relative to those with a negative one.
    A flipped sign, or advantages landing on the wrong rows or tokens, fails this."""
    overrides = ["actor_lr=0.003", "warmup_steps=0", "group_size=4", "minibatch_size=16", "epochs=1", "kl_loss=none"]
    params = load_params(REPO / "params.yaml", [f"grpo.{o}" for o in overrides] + [f"grpo.policy_loss={policy_loss}"])
    torch.manual_seed(0)
    actor, tokenizer = ActorWorker(params, params.grpo, model_dir), load_tokenizer(model_dir)
    prompts = ["12+30=", "98-7=", "123*4=", "5+5="]
    completions = actor.engine.generate(prompts, Sampling(12, n=4, temperature=1.0))
    batch = pack(
        [tokenizer(prompts[c.prompt_index])["input_ids"] for c in completions],
        [c.token_ids for c in completions],
        tokenizer.pad_token_id,
    )
    sign = torch.tensor([1.0, -1.0] * 8)  # half of each group above its mean, half below
    before = actor.logprobs(batch)
    _policy_update(actor, batch, before, sign[:, None] * batch.response_mask)
    moved = ((actor.logprobs(batch) - before) * batch.response_mask).sum(-1)
    assert moved[sign > 0].mean() > moved[sign < 0].mean() + 0.1, moved


def test_the_actors_own_engine_samples_in_the_compute_dtype(model_dir):
    """bf16-mixed: the engine in the actor's process samples under bfloat16 autocast, as the update's passes and the
    engines apart from the actor compute; fp32 samples in float32."""
    for precision, expected in (("bf16-mixed", torch.bfloat16), ("fp32", torch.float32)):
        params = load_params(REPO / "params.yaml", [f"grpo.precision={precision}"])
        actor = ActorWorker(params, params.grpo, model_dir)
        seen: list[torch.dtype] = []
        layer = actor.model.model.layers[0].self_attn.q_proj
        hook = layer.register_forward_hook(lambda module, inputs, output, seen=seen: seen.append(output.dtype))
        actor.sample([Example("arithmetic", "12+30=", "42", "")])
        actor.sample_current(["98-7="], Sampling(4, n=1, temperature=1.0), seed=0)
        hook.remove()
        assert seen and set(seen) == {expected}, (precision, set(seen))


def test_a_stage_that_only_samples_computes_in_its_precision(model_dir):
    """eval.precision (as preferences', rejection's and teacher_data's): bf16 loads the engine's model in bfloat16,
    whose every pass computes in it; fp32, the default, in float32."""
    for precision, expected in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        params = load_params(REPO / "params.yaml", [f"eval.precision={precision}", "device=cpu"])
        engine = policy_engine(params, model_dir, {}, "eval")
        seen: list[torch.dtype] = []
        layer = engine.model.model.layers[0].self_attn.q_proj
        hook = layer.register_forward_hook(lambda module, inputs, output, seen=seen: seen.append(output.dtype))
        engine.generate(["12+30=", "98-7="], Sampling(4, n=2, temperature=1.0))
        hook.remove()
        assert seen and set(seen) == {expected}, (precision, set(seen))


def test_a_single_update_without_an_old_logprob_pass_is_the_update_with_one(model_dir):
    """With one update per rollout the trainer skips the no-grad π_old pass: the update's own forward pass,
    detached, is π_old. Same weights after, same log-probs reported, and more updates than one refuse it."""
    overrides = ["group_size=2", "minibatch_size=4", "warmup_steps=0", "kl_loss=none"]
    params = load_params(REPO / "params.yaml", [f"grpo.{o}" for o in overrides])
    tokenizer = load_tokenizer(model_dir)
    batch = pack_text(tokenizer, BARE, ["1+2=", "98-7="] * 2, ["<think>x</think>", "<answer>91</answer>", "3", "<a>"])
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * batch.response_mask
    weights, reported = [], []
    for precomputed in (True, False):
        torch.manual_seed(0)
        actor = ActorWorker(params, params.grpo, model_dir)
        old = actor.logprobs(batch) if precomputed else None
        _, sampled = _policy_update(actor, batch, old, advantages)
        weights.append(torch.cat([p.detach().flatten() for p in actor.model.parameters()]))
        reported.append(sampled)
    assert torch.allclose(reported[0], reported[1], atol=1e-5)
    assert torch.allclose(weights[0], weights[1], atol=1e-6)
    with pytest.raises(ValueError, match="2 updates per rollout"):
        _policy_update(actor, batch.select(torch.arange(4).repeat(2)), None, advantages.repeat(2, 1))


def test_gold_utility_orders_correct_then_formatted_then_concise():
    correct = gold_utility(EXAMPLE, EXAMPLE.solution)
    wrong = gold_utility(EXAMPLE, "<think>2+0+0=2,1+3+0=5</think><answer>52</answer>")
    rambling_wrong = gold_utility(EXAMPLE, "<think>2+0+0=2,1+3+0=5,0+0+0=0,0+0+0=0,0+0+0=0</think><answer>52</answer>")
    unformatted = gold_utility(EXAMPLE, "42")
    assert correct == pytest.approx(1.0)
    assert correct > wrong > rambling_wrong > unformatted >= 0.0
    assert wrong == pytest.approx(0.3)  # formatted, as short as the worked solution


@settings(max_examples=20, deadline=None)
@given(difference=st.floats(0.05, 1.0), noise=st.floats(0.1, 1.0))
def test_label_noise_follows_bradley_terry(difference, noise):
    rng = random.Random(0)
    agreement = sum(prefers_first(difference, 0.0, noise, rng) for _ in range(4000)) / 4000
    assert agreement == pytest.approx(1 / (1 + torch.exp(torch.tensor(-difference / noise)).item()), abs=0.03)


def test_zero_label_noise_is_the_judges_own_order():
    rng = random.Random(0)
    assert all(prefers_first(0.3, 0.29, 0.0, rng) for _ in range(100))
    assert not any(prefers_first(0.29, 0.3, 0.0, rng) for _ in range(100))


def test_running_moments_equal_the_moments_of_everything_seen():
    values = torch.randn(300, dtype=torch.float64) * 3 + 2
    moments = RunningMoments()
    for chunk in values.split(37):
        moments.update(chunk)
    assert moments.mean == pytest.approx(values.mean().item())
    assert moments.var == pytest.approx(values.var(unbiased=False).item())


def test_scores_are_normalised_then_clipped():
    cfg = RLConfig(reward_normalize=True, reward_clip=1.0)
    scores = prepare_scores(torch.tensor([0.0, 10.0, 20.0]), cfg, RunningMoments())
    assert scores.tolist() == pytest.approx([-1.0, 0.0, 1.0])


def test_adaptive_kl_coefficient_moves_toward_the_target_by_at_most_twenty_percent():
    assert adaptive_kl_coef(0.1, kl=8.0, target=4.0, horizon=100, num_responses=100) == pytest.approx(0.12)
    assert adaptive_kl_coef(0.1, kl=0.0, target=4.0, horizon=100, num_responses=100) == pytest.approx(0.08)
    assert adaptive_kl_coef(0.1, kl=4.0, target=4.0, horizon=100, num_responses=100) == pytest.approx(0.1)
    assert adaptive_kl_coef(0.1, kl=5.0, target=4.0, horizon=1000, num_responses=10) == pytest.approx(0.1002)


def test_explained_variance_is_one_for_a_perfect_critic_and_zero_for_the_mean():
    returns = torch.randn(4, 6)
    mask = torch.ones(4, 6)
    mask[0, 3:] = 0
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    mean = (returns * mask).sum() / mask.sum()
    assert explained_variance(torch.full_like(returns, mean.item()), returns, mask).item() == pytest.approx(0, abs=1e-6)


def _history(rm: list[float], gold: list[float], kl: float = 1.0, entropy: float = 1.0):
    return [
        (i, {"reward": r, "gold_reward": g, "kl": kl, "entropy": entropy})
        for i, (r, g) in enumerate(zip(rm, gold, strict=True))
    ]


def test_alarms_flag_kl_runaway_entropy_collapse_and_reward_hacking():
    cfg = RLConfig(kl_budget=8.0, entropy_floor=0.05)
    steady = _history([0.5] * 20, [0.5] * 20)
    assert alarms(steady, cfg) == []
    assert "kl_budget" in alarms(_history([0.5], [0.5], kl=9.0), cfg)[0]
    assert "entropy" in alarms(_history([0.5], [0.5], entropy=0.01), cfg)[0]
    hacked = _history([0.1 * i for i in range(20)], [0.9 - 0.01 * i for i in range(20)])
    assert any("reward hacking" in alarm for alarm in alarms(hacked, cfg))
    improving = _history([0.1 * i for i in range(20)], [0.5 + 0.01 * i for i in range(20)])
    assert alarms(improving, cfg) == []
    # a gold reward that dips by less than its batch-to-batch noise explains is no trend (PPO's seed 1 raised this
    # alarm at iteration 41 on such a dip, and its gold reward then rose)
    noisy = [0.55, 0.65] * 5 + [0.525, 0.625] * 5  # the window means fall by 0.025 with a spread of 0.05
    assert alarms(_history([0.01 * i for i in range(20)], noisy), cfg) == []
    falling = [0.55, 0.65] * 5 + [0.45, 0.55] * 5  # the same spread, a fall of 0.1
    assert any("reward hacking" in alarm for alarm in alarms(_history([0.01 * i for i in range(20)], falling), cfg))


def test_alarms_flag_iterations_with_nothing_to_learn_from():
    cfg = RLConfig()
    never_right = [(0, {"guard/score": 0.0})] + [(i, {"reward": 0.5, "accuracy": 0.0}) for i in range(1, 6)]
    assert alarms(never_right[:-1], cfg) == []  # four iterations (the start's probe is none)
    assert [alarm.split(" (")[0] for alarm in alarms(never_right, cfg)] == [
        "no sampled response was right in the last 5 iterations"
    ]
    once_right = never_right[:3] + [(3, {"accuracy": 1 / 128})] + never_right[4:]
    assert alarms(once_right, cfg) == []
    # dynamic sampling that kept no group logs no accuracy, only the rounds' share of zero-variance groups
    all_alike = [(i, {"zero_variance_groups": 1.0, "sampling_rounds": 3.0}) for i in range(1, 6)]
    assert alarms(all_alike, cfg)[0].startswith("every group's samples scored alike in the last 5 iterations")
    assert alarms(all_alike[:-1] + [(5, {"zero_variance_groups": 0.9})], cfg) == []


@pytest.mark.parametrize("schedule, expected", [("constant", [0.0, 1.0, 1.0, 1.0]), ("cosine", [0.0, 1.0, 0.5, 0.0])])
def test_the_actor_learning_rate_warms_up_then_follows_its_schedule(model_dir, schedule, expected):
    """Multiples of actor_lr at iterations 0, 1 (warm-up done), 3 (half-way) and 5 (the last of 5)."""
    overrides = ["steps=5", "warmup_steps=1", f"lr_schedule={schedule}"]
    params = load_params(REPO / "params.yaml", [f"grpo.{o}" for o in overrides])
    multiple = ActorWorker(params, params.grpo, model_dir).scheduler.lr_lambdas[0]
    assert [multiple(step) for step in (0, 1, 3, 5)] == pytest.approx(expected, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-1, 1), st.floats(-1, 1)), min_size=2, max_size=40),
    st.sampled_from([0.5, 1.0, 2.0]),
)
def test_a_later_probe_is_clearly_better_only_past_min_z_paired_standard_errors(pairs, min_z):
    """The keep rule against the paired t statistic computed with the statistics module."""
    new, kept = (torch.tensor(column, dtype=torch.float64) for column in zip(*pairs, strict=True))
    differences = [a - b for a, b in pairs]
    mean, spread = statistics.fmean(differences), statistics.stdev(differences)
    margin = mean - min_z * spread / len(differences) ** 0.5
    if abs(margin) > 1e-9:  # away from the boundary, where rounding may fall either way
        assert clearly_better(new, kept, min_z) == (margin > 0)


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class _ScriptedRoles:
    """The calls a guard's probe makes of the actor and the reward role, the judge's scores scripted per probe; the
    decoding each probe asked for is kept in ``samplings``."""

    def __init__(self, probes: list[torch.Tensor]):
        self.probes, self.actor, self.reward, self.samplings = iter(probes), self, self, []

    def sample_current(self, prompts, sampling, seed):
        self.samplings.append(sampling)
        return _Done([Completion(index, [], [], "", []) for index in range(len(prompts)) for _ in range(sampling.n)])

    def judge_scores(self, prompts, completions):
        scores = next(self.probes)
        return _Done({"judge": scores, "disagreement": torch.zeros_like(scores)})

    def weights(self):
        return _Done({})


@pytest.mark.parametrize(("min_z", "kept"), [(0.0, [0, 1, 2]), (1.0, [0, 0, 2])])
def test_the_guard_keeps_a_higher_probe_or_with_min_z_only_one_clearly_better(min_z, kept):
    """A probe higher on average by noise (half its prompts up, half down) replaces the kept one by score alone, not
    with min_z = 1; one higher on every prompt does either way."""
    start = torch.linspace(-0.2, 0.0, 64)
    noise = torch.tensor([0.03 if i % 2 else -0.03 for i in range(64)]) + 0.0005
    roles = _ScriptedRoles([start, start + noise, start + noise + 0.02])
    ppo = load_params(REPO / "params.yaml").ppo
    cfg = dataclasses.replace(ppo, group_size=1, guard=dataclasses.replace(ppo.guard, min_z=min_z))
    guard = Guard("judge", [EXAMPLE] * 64)
    assert [guard.judge(roles, step, cfg, seed=0)["guard/kept_iteration"] for step in range(3)] == kept


@pytest.mark.parametrize(
    ("last_shift", "kept", "says"),
    [
        (0.1, 2, "the last iteration's probe scored highest"),
        (-0.1, 1, "(2) 0.0000, lower"),
        (0.0, 1, "(2) 0.1000, not higher by more than guard.min_gain"),
    ],
)
def test_the_guards_report_says_why_it_kept_an_earlier_iteration_as_it_happened(last_shift, kept, says):
    """guard.json's why: the last iteration when it scored highest; else the kept iteration, and whether the last
    probe was lower or only tied it (a tie keeps the earlier one, and the report must not claim it fell)."""
    start = torch.zeros(8)
    roles = _ScriptedRoles([start, start + 0.1, start + 0.1 + last_shift])
    ppo = load_params(REPO / "params.yaml").ppo
    guard = Guard("judge", [EXAMPLE] * 8)
    for step in range(3):
        guard.judge(roles, step, dataclasses.replace(ppo, group_size=1), seed=0)
    report = guard.report(last_step=2)
    assert report["kept_iteration"] == kept
    assert says in report["why"]


def test_a_greedy_probe_asks_for_one_greedy_answer_per_prompt_and_compares_prompt_by_prompt():
    """With guard.greedy the probe decodes each prompt once, greedily (held-out pass@1's answer), where the default
    samples group_size at the stage's temperature; either way the kept probe's per-prompt scores are one per prompt."""
    ppo = load_params(REPO / "params.yaml").ppo
    cfg = dataclasses.replace(ppo, group_size=4, temperature=0.7)
    for greedy, expected in (
        (True, Sampling(cfg.max_new_tokens, n=1, greedy=True)),
        (False, Sampling(cfg.max_new_tokens, n=4, temperature=0.7)),
    ):
        answers = 1 if greedy else 4
        roles = _ScriptedRoles([torch.linspace(0.0, 1.0, 8 * answers)])
        guard = Guard("judge", [EXAMPLE] * 8)
        guard.judge(roles, 0, dataclasses.replace(cfg, guard=dataclasses.replace(cfg.guard, greedy=greedy)), seed=0)
        assert roles.samplings == [expected]
        assert guard.kept_per_prompt.shape == (8,)


def test_a_held_out_probe_is_the_training_splits_tail_and_training_never_draws_it():
    """guard.held_out takes the last guard.prompts out of the prompts training draws from; without it the probe is
    the first ones, still trained on; holding out so many that a batch cannot be drawn is refused naming the key."""
    examples = [dataclasses.replace(EXAMPLE, prompt=f"{i}+1=", answer=str(i + 1)) for i in range(40)]
    ppo = load_params(REPO / "params.yaml").ppo
    shared = dataclasses.replace(ppo, rollout_batch_size=8, guard=dataclasses.replace(ppo.guard, prompts=10))
    training, probe = probe_split(examples, shared, "ppo")
    assert training == examples and probe == examples[:10]
    held_out = dataclasses.replace(shared, guard=dataclasses.replace(shared.guard, held_out=True))
    training, probe = probe_split(examples, held_out, "ppo")
    assert probe == examples[30:] and training == examples[:30]
    assert not {e.prompt for e in training} & {e.prompt for e in probe}
    too_many = dataclasses.replace(held_out, guard=dataclasses.replace(held_out.guard, prompts=33))
    with pytest.raises(ValueError, match=r"ppo.guard.prompts: holding out 33 of 40 training prompts"):
        probe_split(examples, too_many, "ppo")


def test_the_verifier_may_guard_a_stage_trained_on_it_only_on_held_out_prompts():
    """On prompts the stage trains on, its own reward is no check of it (refused); on held-out prompts it is early
    stopping on a validation split (accepted)."""
    overrides = ["grpo.guard.signal=verifier"]
    with pytest.raises(Exception, match="grpo.guard.signal: verifier is a held-out signal only"):
        load_params(REPO / "params.yaml", overrides, runs=["grpo"])
    grpo = load_params(REPO / "params.yaml", [*overrides, "grpo.guard.held_out=true"], runs=["grpo"]).grpo
    assert (grpo.guard.signal, grpo.guard.held_out) == ("verifier", True)
