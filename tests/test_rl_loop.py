"""The RL loop of tasks/rl/trainer.py: dynamic sampling's refill, rollout bookkeeping, which roles a config
starts, the critic's regression, and a toy GRPO run whose reward rises under the trainer's own collect and the
policy-gradient learner (tasks/rl/policy_gradient.py)."""

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models import load_tokenizer
from tasks.algos.tokens import masked_mean
from tasks.common.config import Params, RLConfig
from tasks.common.training import epoch_batch, make_deterministic
from tasks.data.problems import Example
from tasks.data.prompts import BARE
from tasks.rl.learner import LoopState, Rollout
from tasks.rl.placement import place
from tasks.rl.policy_gradient import learn, needed_roles
from tasks.rl.rewards import REWARD_MODEL, RewardInputs
from tasks.rl.role_handles import ActorEngine, ActorHandle, Roles, Worker
from tasks.rl.sequences import pack_text
from tasks.rl.trainer import collect
from tasks.rl.workers import CriticWorker
from tasks.rollout.engine import Completion
from tests.conftest import tiny_model

SEED = 0
EXAMPLES = [Example("arithmetic", f"q{i}=", str(i), f"<answer>{i}</answer>") for i in range(12)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny"))


def new_clock() -> dict[str, float]:
    return dict.fromkeys(("time/generate", "time/score", "time/train"), 0.0)


# --- collect: a fake actor and a scorer whose rewards say which groups are informative


class FakeActor:
    """An actor role whose ``sample`` returns ``group_size`` deterministic completions per example; the text of
    sample s of prompt p is ``"p|s"``, so every row says which prompt and sample it is."""

    def __init__(self, group_size: int):
        self.group_size, self.batches = group_size, []

    def sample(self, examples: list[Example]) -> list[Completion]:
        prompts = [example.prompt for example in examples]
        self.batches.append(prompts)
        return [
            Completion(index, [1, 30 + index], [10 + index, 20 + sample], f"{prompt}|{sample}", [-0.5, -0.25])
            for index, prompt in enumerate(prompts)
            for sample in range(self.group_size)
        ]


class PatternScorer:
    """``RewardScorer.score``'s interface. In round r, group g scores 100r + 10g + sample when ``pattern[r][g]``
    (an informative group) and 100r + 10g on every row otherwise (all equal: uninformative). Each round
    reports one error, so the failures of the rounds add up."""

    def __init__(self, pattern: list[list[bool]], group_size: int):
        self.pattern, self.group_size, self.rounds = pattern, group_size, 0

    def score(self, inputs: RewardInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, int]]:
        assert [int(text.split("|")[1]) for text in inputs.responses] == list(range(self.group_size)) * (
            len(inputs) // self.group_size
        )
        informative = self.pattern[self.rounds]
        scores = [
            expected_score(self.rounds, row // self.group_size, row % self.group_size, informative)
            for row in range(len(inputs))
        ]
        self.rounds += 1
        total = torch.tensor(scores, dtype=torch.float32)
        return total, {"a": total.clone(), "b": 1000 - total}, {"errors/a": 1}


def expected_score(round_: int, group: int, sample: int, informative: list[bool]) -> float:
    return 100.0 * round_ + 10.0 * group + (sample if informative[group] else 0)


def run_collect(pattern: list[list[bool]], cfg: RLConfig):
    actor = ActorHandle(Worker(FakeActor, (cfg.group_size,), None))
    roles = Roles(actor=actor, rollout=ActorEngine(actor))  # the engine in the actor's process
    scorer = PatternScorer(pattern, cfg.group_size)
    state = LoopState()
    rollout, stats = collect(roles, scorer, EXAMPLES, cfg, state, SEED, new_clock())
    return rollout, stats, roles.actor.local, state


def expected_rows(batches: list[list[str]], pattern: list[list[bool]], keep: list[tuple[int, int]], group_size: int):
    """(prompt, text, score) of every row of the kept (round, group)s, in order."""
    return [
        (batches[r][g], f"{batches[r][g]}|{s}", expected_score(r, g, s, pattern[r]))
        for r, g in keep
        for s in range(group_size)
    ]


def assert_rows(rollout: Rollout, rows: list[tuple[str, str, float]]) -> None:
    assert [e.prompt for e in rollout.examples] == [prompt for prompt, _, _ in rows]
    assert [c.text for c in rollout.completions] == [text for _, text, _ in rows]
    assert rollout.scores.tolist() == [score for _, _, score in rows]
    assert rollout.components["a"].tolist() == [score for _, _, score in rows]
    assert rollout.components["b"].tolist() == [1000 - score for _, _, score in rows]


def dynamic(**changes) -> RLConfig:
    return replace(Params().grpo, dynamic_sampling=True, **changes)


def test_dynamic_sampling_refills_the_batch_then_keeps_exactly_rollout_batch_size_groups():
    T, F = True, False
    pattern = [[T, F, F, T], [F, F, F, F], [T, T, T, F], [T, T, T, T]]
    cfg = dynamic(rollout_batch_size=4, group_size=2, max_sampling_rounds=4)
    rollout, stats, actor, state = run_collect(pattern, cfg)
    # 2 informative groups, then 0, then 3: full (5 >= 4) after round 3, the 4th round never runs
    assert stats == {"zero_variance_groups": pytest.approx((0.5 + 1.0 + 0.25) / 3), "sampling_rounds": 3}
    assert state.cursor == 3
    # every round rolls out a fresh batch of prompts: batch c of the seeded epoch order
    assert actor.batches == [[EXAMPLES[i].prompt for i in epoch_batch(12, 4, c, SEED)] for c in range(3)]
    assert len(set(map(tuple, actor.batches))) == 3
    # the first 4 of the 5 informative groups, in the order they were sampled; the 5th (round 2, group 2) dropped
    assert len(rollout.scores) == 4 * 2
    assert_rows(rollout, expected_rows(actor.batches, pattern, [(0, 0), (0, 3), (2, 0), (2, 1)], 2))
    assert rollout.failures == {"errors/a": 3}  # every round scored counts, the one that kept nothing too


def test_dynamic_sampling_stops_at_max_sampling_rounds_with_what_it_has():
    T, F = True, False
    pattern = [[F, T, F, F], [F, F, F, F], [F, F, T, F], [T, T, T, T]]
    cfg = dynamic(rollout_batch_size=4, group_size=3, max_sampling_rounds=3)
    rollout, stats, actor, state = run_collect(pattern, cfg)
    assert stats == {"zero_variance_groups": pytest.approx((0.75 + 1.0 + 0.75) / 3), "sampling_rounds": 3}
    assert len(actor.batches) == 3 and state.cursor == 3
    assert len(rollout.scores) == 2 * 3
    assert_rows(rollout, expected_rows(actor.batches, pattern, [(0, 1), (2, 2)], 3))


def test_a_round_that_fills_the_batch_is_the_only_round():
    pattern = [[True] * 4, [True] * 4]
    rollout, stats, actor, state = run_collect(pattern, dynamic(rollout_batch_size=4, group_size=2))
    assert stats == {"zero_variance_groups": 0.0, "sampling_rounds": 1}
    assert len(actor.batches) == 1 and state.cursor == 1
    assert_rows(rollout, expected_rows(actor.batches, pattern, [(0, g) for g in range(4)], 2))


def test_without_dynamic_sampling_one_round_keeps_the_whole_batch_uninformative_groups_too():
    T, F = True, False
    pattern = [[T, F, F, F], [T, T, T, T]]
    cfg = replace(Params().grpo, dynamic_sampling=False, rollout_batch_size=4, group_size=2, max_sampling_rounds=3)
    rollout, stats, actor, state = run_collect(pattern, cfg)
    assert stats == {"zero_variance_groups": 0.75, "sampling_rounds": 1}
    assert len(actor.batches) == 1 and state.cursor == 1
    assert_rows(rollout, expected_rows(actor.batches, pattern, [(0, g) for g in range(4)], 2))
    assert rollout.failures == {"errors/a": 1}


def test_when_no_group_is_informative_collect_returns_none_after_every_round():
    pattern = [[False] * 4] * 3
    rollout, stats, actor, state = run_collect(pattern, dynamic(rollout_batch_size=4, group_size=2))
    assert rollout is None
    assert stats == {"zero_variance_groups": 1.0, "sampling_rounds": 3}
    assert len(actor.batches) == 3 and state.cursor == 3


@settings(max_examples=60, deadline=None)
@given(data=st.data(), batch_size=st.integers(1, 4), group_size=st.integers(2, 3), max_rounds=st.integers(1, 4))
def test_dynamic_sampling_keeps_the_first_informative_groups_up_to_the_batch_size(
    data, batch_size, group_size, max_rounds
):
    pattern = data.draw(st.lists(st.lists(st.booleans(), min_size=batch_size, max_size=batch_size), min_size=4))
    cfg = dynamic(rollout_batch_size=batch_size, group_size=group_size, max_sampling_rounds=max_rounds)
    rollout, stats, actor, _ = run_collect(pattern, cfg)
    # the reference: rounds until batch_size informative groups are in hand or max_rounds have run
    informative, rounds = [], 0
    while rounds < max_rounds and len(informative) < batch_size:
        informative += [(rounds, g) for g in range(batch_size) if pattern[rounds][g]]
        rounds += 1
    assert stats["sampling_rounds"] == rounds == len(actor.batches)
    if not informative:
        assert rollout is None
        return
    kept = informative[:batch_size]
    assert len(rollout.scores) == len(kept) * group_size <= batch_size * group_size
    assert_rows(rollout, expected_rows(actor.batches, pattern, kept, group_size))
    assert rollout.failures == {"errors/a": rounds}


# --- Rollout.groups / Rollout.join


def numbered_rollout(rows: int, offset: int, failures: dict[str, int]) -> Rollout:
    """Row i (i counted from ``offset``) is recognisable in every field."""
    ids = range(offset, offset + rows)
    return Rollout(
        [Example("arithmetic", f"p{i}", str(i), "") for i in ids],
        [Completion(i, [1], [i], f"r{i}", [-float(i)]) for i in ids],
        torch.tensor([float(i) for i in ids]),
        {"x": torch.tensor([10.0 * i for i in ids]), "y": torch.tensor([-float(i) for i in ids])},
        failures,
    )


def assert_numbered(rollout: Rollout, ids: list[int]) -> None:
    assert [e.prompt for e in rollout.examples] == [f"p{i}" for i in ids]
    assert [c.text for c in rollout.completions] == [f"r{i}" for i in ids]
    assert [c.token_ids for c in rollout.completions] == [[i] for i in ids]
    assert rollout.scores.tolist() == [float(i) for i in ids]
    assert rollout.components["x"].tolist() == [10.0 * i for i in ids]
    assert rollout.components["y"].tolist() == [-float(i) for i in ids]


def test_rollout_groups_selects_whole_groups_in_every_field():
    rollout = numbered_rollout(8, 0, {"errors/x": 2})
    selected = rollout.groups(torch.tensor([False, True, False, True]), group_size=2)
    assert_numbered(selected, [2, 3, 6, 7])
    assert selected.failures == {"errors/x": 2}
    assert_numbered(rollout.groups(torch.tensor([True, False]), group_size=4), [0, 1, 2, 3])
    assert_numbered(rollout.groups(torch.zeros(2, dtype=torch.bool), group_size=4), [])
    assert_numbered(rollout, list(range(8)))  # the original is left as it was


def test_rollout_join_concatenates_row_by_row_and_sums_failures():
    first = numbered_rollout(4, 0, {"errors/x": 1, "timeouts/y": 2})
    second = numbered_rollout(2, 100, {"errors/x": 3})
    third = numbered_rollout(4, 200, {"errors/y": 5}).groups(torch.tensor([False, True]), group_size=2)
    joined = Rollout.join([first, second, third])
    assert_numbered(joined, [0, 1, 2, 3, 100, 101, 202, 203])
    assert joined.failures == {"errors/x": 4, "timeouts/y": 2, "errors/y": 5}
    # selecting groups of a joined rollout still maps every field to the same rows
    assert_numbered(joined.groups(torch.tensor([False, True, True, False]), group_size=2), [2, 3, 100, 101])


# --- needed_roles

GRPO_NO_KL = replace(Params().grpo, kl_loss="none")


@pytest.mark.parametrize(
    "cfg, roles",
    [
        (RLConfig(), {"critic", "reference", "reward"}),  # PPO: GAE, KL in the reward, the reward model
        (replace(RLConfig(), kl_in_reward=False, rewards={"accuracy": 1.0}), {"critic"}),
        (GRPO_NO_KL, set()),
        (Params().grpo, {"reference"}),  # kl_loss k3
        (replace(GRPO_NO_KL, kl_in_reward=True), {"reference"}),
        (replace(GRPO_NO_KL, ref_reset_every=2), {"reference"}),
        (replace(GRPO_NO_KL, advantage="gae"), {"critic"}),
        (replace(GRPO_NO_KL, advantage="rloo"), set()),
        (replace(GRPO_NO_KL, advantage="reinforce_pp"), set()),
        (replace(GRPO_NO_KL, rewards={"accuracy": 1.0, REWARD_MODEL: 0.05}), {"reward"}),
        (replace(GRPO_NO_KL, rewards={"accuracy": 1.0, REWARD_MODEL: 0.0}), set()),
        (replace(GRPO_NO_KL, rewards={REWARD_MODEL: -1.0}), {"reward"}),
    ],
)
def test_needed_roles(cfg, roles):
    assert needed_roles(cfg) == roles


# --- the critic


def test_the_critics_value_loss_falls_on_a_fixed_batch(model_dir, one_thread):
    cfg = RLConfig(critic_lr=3e-3, warmup_steps=0, minibatch_size=8, epochs=1)
    critic = CriticWorker(Params(device="cpu"), cfg, model_dir)
    batch = pack_text(
        load_tokenizer(model_dir),
        BARE,
        ["1+2=", "98-7=", "1+2=", "12*3="],
        ["<think>x</think>", "<answer>91</answer>", "3", "36"],
    )
    returns = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * batch.response_mask
    losses, errors = [], []
    for _ in range(10):  # as learn() does: the rollout's values, then an update toward the returns
        values = critic.values(batch)
        errors.append(0.5 * masked_mean((values - returns) ** 2, batch.response_mask).item())
        losses.append(critic.update(batch, values, returns)["value_loss"])
    assert losses[-1] < 0.5 * losses[0], losses
    assert errors[-1] < 0.5 * errors[0], errors


def test_the_critics_values_pass_is_deterministic(model_dir, one_thread):
    critic = CriticWorker(Params(device="cpu"), RLConfig(), model_dir)
    batch = pack_text(load_tokenizer(model_dir), BARE, ["1+2=", "98-7="], ["<think>x</think>", "<answer>91</answer>"])
    assert torch.equal(critic.values(batch), critic.values(batch))


# --- a toy GRPO run


class DigitScorer:
    """In-process stand-in for RewardScorer: the reward is the fraction of a response's tokens that are digits."""

    def __init__(self):
        self.batch_means: list[float] = []

    def score(self, inputs: RewardInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, int]]:
        rewards = torch.tensor(
            [
                sum(ch.isdigit() for ch in text) / max(1, n)
                for text, n in zip(inputs.responses, inputs.num_tokens, strict=True)
            ]
        )
        self.batch_means.append(rewards.mean().item())
        return rewards, {"digits": rewards.clone()}, {}


def test_a_toy_grpo_run_raises_its_mean_reward(model_dir, one_thread):
    """GRPO (the grpo stage's defaults: dynamic sampling, k3 KL loss against a reference) on a random tiny
    policy, rewarded for writing digits: 12 iterations of collect + learn at a high learning rate more than
    double the reward of the first rollout (about 0.1 at random, 10 of the ~100 tokens are digits)."""
    steps = 12
    cfg = replace(
        Params().grpo,
        steps=steps,
        rollout_batch_size=8,
        group_size=4,
        actor_lr=1e-2,
        warmup_steps=0,
        max_new_tokens=8,
    )
    params = Params(seed=SEED, device="cpu")
    make_deterministic(SEED)
    roles = place(params, cfg, model_dir, [], needed_roles(cfg))
    assert roles.reference and not (roles.critic or roles.reward or roles.teacher) and not roles.rollout.apart
    tokenizer, scorer, state = load_tokenizer(model_dir), DigitScorer(), LoopState(kl_coef=cfg.kl_coef)
    examples = [Example("arithmetic", f"{a}+{b}=", str(a + b), "") for a in range(4) for b in range(4)]
    rewards, history = [], []
    for _ in range(steps):
        scored = len(scorer.batch_means)
        rollout, metrics = collect(roles, scorer, examples, cfg, state, SEED, new_clock())
        rewards.append(sum(scorer.batch_means[scored:]) / (len(scorer.batch_means) - scored))  # every response
        assert rollout is not None
        history.append(metrics | learn(roles, rollout, tokenizer, cfg, state, new_clock()))
    first, last = rewards[0], sum(rewards[-3:]) / 3
    assert last > first + 0.2 and last > 2 * first, rewards
    assert history[-1]["kl"] > history[0]["kl"], [m["kl"] for m in history]  # the policy left its reference
