"""Online preference optimisation in the RL loop: the preference learner on a toy task, semi-online engine sync,
the dip across the offline-to-online switch, and what the online stage may run."""

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models import load_tokenizer
from tasks.common.config import LEARNERS, Params
from tasks.common.training import make_deterministic
from tasks.data.problems import Example
from tasks.data.prompts import BARE
from tasks.rl.learner import LoopState, Rollout
from tasks.rl.online_preference import PAIRS, learn_preferences, preference_roles
from tasks.rl.placement import place
from tasks.rl.sequences import pack_text
from tasks.rl.trainer import HELDOUT, alarms, collect, dip_and_recovery
from tasks.rl.workers import ActorWorker
from tasks.rollout.engine import Completion, Sampling
from tasks.stages import online_dpo
from tests.conftest import tiny_model
from tests.test_rl_loop import DigitScorer, new_clock

SEED = 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny"))


def test_the_online_stage_runs_exactly_the_learners_its_params_may_name():
    assert set(online_dpo.LEARNERS) == set(LEARNERS)


def test_reference_free_losses_start_no_reference_role():
    cfg = Params().online_dpo
    assert preference_roles(cfg) == {"reference"}
    assert preference_roles(replace(cfg, preference_loss="simpo")) == set()
    assert preference_roles(replace(cfg, rewards={"reward_model": 1.0})) == {"reference", "reward"}


def test_a_toy_online_dpo_run_raises_its_mean_reward(model_dir, one_thread):
    """Online DPO (best vs worst of each group of 4, against the fixed starting policy) on a random tiny policy
    rewarded for writing digits: 12 iterations of collect + learn raise the reward well above the first rollout's."""
    steps = 12
    cfg = replace(
        Params().online_dpo,
        steps=steps,
        rollout_batch_size=8,
        group_size=4,
        actor_lr=1e-2,
        warmup_steps=0,
        max_new_tokens=8,
        beta=0.5,
    )
    params = Params(seed=SEED, device="cpu")
    make_deterministic(SEED)
    roles = place(params, cfg, model_dir, [], preference_roles(cfg))
    tokenizer, scorer, state = load_tokenizer(model_dir), DigitScorer(), LoopState()
    examples = [Example("arithmetic", f"{a}+{b}=", str(a + b), "") for a in range(4) for b in range(4)]
    rewards, history = [], []
    for _ in range(steps):
        scored = len(scorer.batch_means)
        rollout, metrics = collect(roles, scorer, examples, cfg, state, SEED, new_clock())
        rewards.append(sum(scorer.batch_means[scored:]) / (len(scorer.batch_means) - scored))
        history.append(metrics | learn_preferences(roles, rollout, tokenizer, cfg, state, new_clock()))
    first, last = rewards[0], sum(rewards[-3:]) / 3
    assert last > first + 0.2, rewards
    assert history[0]["pairs"] == cfg.rollout_batch_size  # dynamic sampling filled the batch with untied groups
    assert history[-1]["kl"] > history[0]["kl"], [m["kl"] for m in history]  # the policy left its reference
    assert history[0]["logprob_parity"] < 1e-4  # fully online: the engine sampled with the trainer's weights


@pytest.mark.parametrize("sync_every", [1, 3])
def test_the_engine_samples_from_weights_refreshed_every_sync_every_updates(model_dir, one_thread, sync_every):
    cfg = replace(Params().online_dpo, sync_every=sync_every, actor_lr=1e-2, warmup_steps=0, epochs=1)
    actor = ActorWorker(Params(seed=SEED, device="cpu"), cfg, model_dir)
    batch = pack_text(
        load_tokenizer(model_dir), BARE, ["1+2=", "3+4="] * 2, ["3", "7", "4", "9"]
    )  # 2 chosen, 2 rejected

    def engine_weights() -> torch.Tensor:
        return actor.engine.model.model.embed_tokens.weight.detach().clone()

    synced = engine_weights()
    for update in range(1, 7):
        actor.update(batch, PAIRS, {"ref_logprobs": actor.logprobs(batch)})
        current = actor.model.model.embed_tokens.weight.detach()
        if update % sync_every == 0:
            assert torch.equal(engine_weights(), current)
            synced = engine_weights()
        else:  # semi-online: still the weights of the last sync
            assert torch.equal(engine_weights(), synced) and not torch.equal(synced, current)


def test_a_semi_online_actor_resumes_with_the_engine_weights_it_had(model_dir, one_thread):
    cfg = replace(Params().online_dpo, sync_every=3, actor_lr=1e-2, warmup_steps=0, epochs=1)
    params = Params(seed=SEED, device="cpu")
    actor = ActorWorker(params, cfg, model_dir)
    batch = pack_text(load_tokenizer(model_dir), BARE, ["1+2=", "3+4="] * 2, ["3", "7", "4", "9"])
    for _ in range(4):  # synced after update 3, one update since
        actor.update(batch, PAIRS, {"ref_logprobs": actor.logprobs(batch)})
    resumed = ActorWorker(params, cfg, model_dir)
    resumed.load_state(actor.state())
    for name, tensor in actor.engine.model.state_dict().items():
        assert torch.equal(resumed.engine.model.state_dict()[name], tensor), name
    assert (resumed.updates, resumed.synced_at) == (4, 3)


def _history(values: list[float], every: int = 10) -> list[tuple[int, dict[str, float]]]:
    return [(index * every, {HELDOUT: value, "reward": 0.0}) for index, value in enumerate(values)]


@pytest.mark.parametrize(
    "values, dip, recovery",
    [
        ([0.5, 0.55, 0.6], 0.0, 0),  # never below the start
        ([0.5, 0.4, 0.45, 0.52, 0.3], 0.1, 30),  # the later fall is after the recovery
        ([0.5, 0.45, 0.3, 0.5], 0.2, 30),  # equal to the start counts as recovered
        ([0.5, 0.45, 0.4], 0.1, None),  # not back yet
    ],
)
def test_the_dip_is_the_largest_fall_below_the_start_before_recovery(values, dip, recovery):
    found_dip, found_recovery = dip_and_recovery(_history(values))
    assert found_dip == pytest.approx(dip) and found_recovery == recovery


@given(st.lists(st.floats(0, 1), min_size=2, max_size=20))
@settings(max_examples=100, deadline=None)
def test_the_dip_is_never_negative_and_recovery_is_a_probe_at_or_above_the_start(values):
    history = _history(values)
    dip, recovery = dip_and_recovery(history)
    assert dip >= 0
    if recovery:
        value = dict(history)[recovery][HELDOUT]
        assert value >= values[0] and dip == pytest.approx(values[0] - min(values[: recovery // 10]))


def test_a_rollout_of_ties_makes_no_pairs_no_update_and_no_alarm(model_dir, one_thread):
    cfg = replace(Params().online_dpo, group_size=2, dynamic_sampling=False)
    roles = place(Params(seed=SEED, device="cpu"), cfg, model_dir, [], preference_roles(cfg))
    before = roles.actor.weights().result()
    prompt = load_tokenizer(model_dir)("1+2=")["input_ids"]
    completions = [Completion(0, prompt, [5, 6], "ab", [-1.0, -1.0]), Completion(0, prompt, [7], "c", [-1.0])]
    example = Example("arithmetic", "1+2=", "3", "")
    rollout = Rollout([example, example], completions, torch.tensor([0.5, 0.5]), {}, {})
    metrics = learn_preferences(roles, rollout, load_tokenizer(model_dir), cfg, LoopState(), new_clock())
    assert metrics == {"pairs": 0.0}
    after = roles.actor.weights().result()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert alarms([(1, {"reward": 0.5, **metrics})], cfg) == []


def test_the_held_out_probe_draws_from_its_own_seed_and_leaves_trainings_random_state_alone(model_dir, one_thread):
    actor = ActorWorker(Params(seed=SEED, device="cpu"), Params().online_dpo, model_dir)
    sampling = Sampling(8, n=2, temperature=1.0)
    before = torch.get_rng_state()
    first = actor.sample_current(["1+2=", "3+4="], sampling, seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    again = actor.sample_current(["1+2=", "3+4="], sampling, seed=7)
    other = actor.sample_current(["1+2=", "3+4="], sampling, seed=8)
    assert [c.token_ids for c in first] == [c.token_ids for c in again] != [c.token_ids for c in other]
