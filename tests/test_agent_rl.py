"""RL on multi-turn episodes (tasks/rl on tasks/rollout/episodes.py): an episode is a completion whose mask leaves
its observations out of every loss, advantage and statistic; GRPO runs on the calculator and the guessing game
through the trainer's own collect and learner; single-turn completions pack exactly as before."""

import random
from dataclasses import replace

import pytest
import torch
from test_episodes import Scripted, call, ending_often, segments

import examples.calculator as calculator
import examples.guess_number as guess_number
from models import build_char_tokenizer, build_tiny_llama, load_tokenizer
from tasks.algos.tokens import token_logprobs
from tasks.common.config import BaseConfig, Params
from tasks.common.training import make_deterministic
from tasks.rl.core_algos import gae, last_token_index, reinforce_pp_advantages, shaped_rewards
from tasks.rl.learner import LoopState, Rollout
from tasks.rl.placement import place
from tasks.rl.policy_gradient import learn, needed_roles, policy_gradient_loss
from tasks.rl.rewards import RewardInputs, RewardScorer
from tasks.rl.sequences import pack
from tasks.rl.trainer import collect, rollout_metrics
from tasks.rl.workers import Minibatch
from tasks.rollout.engine import Completion, Sampling
from tasks.rollout.episodes import run_episodes

SEED = 0
PRODUCT = calculator.generate(random.Random(SEED), None)  # "What is A*B?" with its answer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random policy nudged towards ending its turns (a turn that does not end ends its episode), with room
    for a few turns and observations."""
    path, tokenizer = tmp_path_factory.mktemp("tiny"), build_char_tokenizer()
    config = BaseConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=256)
    model = build_tiny_llama(config, tokenizer, SEED)
    ending_often(model, tokenizer.eos_token_id, steps=12)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def calculator_episode() -> Completion:
    """An episode of the calculator (a tool call, its answer, the final turn) as the rollout's completion."""
    expression = PRODUCT.prompt.removeprefix("What is ").removesuffix("?")
    final = f"<think>{expression}={PRODUCT.answer}</think><answer>{PRODUCT.answer}</answer>"
    turns = [call("calculate", f'{{"expression": "{expression}"}}'), final]
    (episode,) = run_episodes(Scripted(build_char_tokenizer(), turns), [PRODUCT], calculator, Sampling(128), 4, 4096)
    completion = episode.completion()
    assert completion.prompt_ids + completion.token_ids == episode.token_ids
    assert completion.mask == episode.mask[episode.prompt_length :] and completion.text == final
    assert (completion.episode.turns, completion.episode.tool_calls, completion.episode.tool_errors) == (2, 1, 0)
    return completion


def test_an_episodes_observation_tokens_get_no_gradient_from_the_policy_loss_kl_or_entropy():
    tokenizer = build_char_tokenizer()
    episode = calculator_episode()
    single = Completion(0, episode.prompt_ids, episode.token_ids[:5], "", [-1.0] * 5)
    rollout = Rollout([PRODUCT] * 2, [episode, single], torch.tensor([1.0, 0.0]), {}, {})
    batch = rollout.packed(tokenizer)
    mask = batch.response_mask
    model_turn, observation, last = (flag for flag, _ in segments(episode))  # the response: no prompt
    assert (model_turn, observation, last) == (1, 0, 1)
    assert mask[0].tolist() == episode.mask and mask[1].tolist() == [1.0] * 5 + [0.0] * (mask.shape[1] - 5)
    assert int(last_token_index(mask)[0]) == len(episode.token_ids) - 1  # the score sits on the final turn

    cfg = replace(Params().grpo, kl_loss="k3", entropy_coef=0.1)
    logits = torch.randn(*mask.shape, len(tokenizer), requires_grad=True)
    logprobs = token_logprobs(logits, batch.response_ids)
    old = logprobs.detach()  # a ratio of 1: no clip binds, so every model token has a gradient
    terms = {
        "policy": ({"advantages": torch.ones_like(mask), "ref_logprobs": logprobs.detach()}, 0.0),
        "kl": ({"advantages": torch.zeros_like(mask), "ref_logprobs": torch.randn_like(mask)}, 0.0),
        "entropy": ({"advantages": torch.zeros_like(mask), "ref_logprobs": logprobs.detach()}, cfg.entropy_coef),
    }
    for name, (inputs, entropy_coef) in terms.items():
        logits.grad = None
        minibatch = Minibatch(batch, logprobs, logits, old, inputs, 1.0, 1.0)
        loss, _ = policy_gradient_loss(minibatch, replace(cfg, entropy_coef=entropy_coef), kl_coef=1.0)
        loss.backward(retain_graph=True)
        per_position = logits.grad.abs().sum(-1)
        assert (per_position[mask == 0] == 0).all(), name  # no observation (nor padding) moves the policy
        assert (per_position[mask == 1] > 0).all(), name


def test_advantages_and_returns_skip_observations_as_if_the_model_tokens_were_contiguous():
    """GAE and REINFORCE++ on an episode equal them on its model tokens alone, as a single-turn response's: an
    observation is the environment's move, not a step of the policy, and its value is never a target."""
    torch.manual_seed(SEED)
    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0]], dtype=torch.float)
    rewards = shaped_rewards(torch.tensor([1.0]), mask, 0.1 * torch.randn(1, 8))
    assert rewards[0].nonzero().flatten().tolist() == [0, 1, 5, 6]  # the score on the final turn's last token
    assert rewards[0, 6] > 0.5
    values = torch.randn(1, 8)
    kept = mask[0].bool()
    alone = torch.ones(1, 4)
    advantages, returns = gae(rewards, values, mask, 0.9, 0.8)
    alone_advantages, alone_returns = gae(rewards[:, kept], values[:, kept], alone, 0.9, 0.8)
    assert torch.allclose(advantages[:, kept], alone_advantages) and torch.allclose(returns[:, kept], alone_returns)
    assert (advantages[:, ~kept] == 0).all() and (returns[:, ~kept] == 0).all()
    reinforce, _ = reinforce_pp_advantages(rewards, mask, 1, gamma=0.9)
    alone_reinforce, _ = reinforce_pp_advantages(rewards[:, kept], alone, 1, gamma=0.9)
    assert torch.allclose(reinforce[:, kept], alone_reinforce) and (reinforce[:, ~kept] == 0).all()


def test_single_turn_completions_pack_exactly_as_before():
    prompts, responses = [[5, 6, 7], [8]], [[1, 2], [3, 4, 9, 10]]
    packed = pack(prompts, responses, 0)
    masked = pack(prompts, responses, 0, [None, None])
    rollout = Rollout(
        [PRODUCT] * 2,
        [Completion(i, p, r, "", [0.0] * len(r)) for i, (p, r) in enumerate(zip(prompts, responses, strict=True))],
        torch.zeros(2),
        {},
        {},
    )
    from_rollout = rollout.packed(build_char_tokenizer())
    expected_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    expected_ids = torch.tensor([[5, 6, 7, 1, 2, 0, 0], [0, 0, 8, 3, 4, 9, 10]])
    for batch in (packed, masked):
        assert torch.equal(batch.response_mask, expected_mask) and torch.equal(batch.input_ids, expected_ids)
        assert torch.equal(batch.position_ids, torch.tensor([[0, 1, 2, 3, 4, 4, 4], [0, 0, 0, 1, 2, 3, 4]]))
        assert batch.prompt_width == 3
    assert torch.equal(from_rollout.response_mask, expected_mask)
    assert torch.equal(from_rollout.attention_mask, packed.attention_mask)


def test_the_environment_reward_is_each_episodes_and_zero_for_single_turn_responses():
    single = RewardInputs([PRODUCT] * 2, ["a", "b"], [1, 1], [False, False], 8)
    episodes = replace(single, env_rewards=[1.0, 0.5])
    with RewardScorer({"environment": 2.0}, 30.0) as scorer:
        assert scorer.score(single)[0].tolist() == [0.0, 0.0]
        total, components, _ = scorer.score(episodes)
    assert total.tolist() == [2.0, 1.0] and components["environment"].tolist() == [1.0, 0.5]
    assert episodes.row(1).env_rewards == [0.5]


@pytest.mark.parametrize("task", [calculator, guess_number])
def test_grpo_plays_episodes_through_the_trainers_collect_and_learner(task, model_dir, one_thread):
    """A few GRPO iterations of a random tiny policy on a task with a tool (the calculator: it answers at once) or
    an environment (the guessing game: every unreadable guess is answered, so it plays every turn allowed)."""
    params = Params(seed=SEED, device="cpu")
    params = replace(params, task=replace(params.task, name=task.__name__), agent=replace(params.agent, max_turns=3))
    cfg = replace(Params().grpo, steps=2, rollout_batch_size=4, group_size=2, max_new_tokens=8, warmup_steps=0)
    cfg = replace(cfg, rewards={"accuracy": 1.0, "environment": 1.0, "length": 0.1}, dynamic_sampling=False)
    examples = [task.generate(random.Random(i), None) for i in range(8)]
    make_deterministic(SEED)
    roles = place(params, cfg, model_dir, [], needed_roles(cfg))
    tokenizer, state = load_tokenizer(model_dir), LoopState(kl_coef=cfg.kl_coef)
    clock = dict.fromkeys(("time/generate", "time/score", "time/train"), 0.0)
    with RewardScorer(cfg.rewards, 30.0) as scorer:
        for _ in range(cfg.steps):
            rollout, _ = collect(roles, scorer, examples, cfg, state, SEED, clock)
            metrics = rollout_metrics(rollout) | learn(roles, rollout, tokenizer, cfg, state, clock)
            episodes = [c.episode for c in rollout.completions]
            assert all(e is not None for e in episodes) and len(episodes) == 8
            assert metrics["turns"] == sum(e.turns for e in episodes) / 8
            assert metrics["tool_calls"] == sum(e.tool_calls for e in episodes) / 8
            assert {"tool_errors", "max_turns_rate", "rewards/environment", "entropy", "kl"} <= set(metrics)
            # the response length counts the model's own tokens, never an observation's
            model_tokens = sum(c.model_tokens for c in rollout.completions) / 8
            assert metrics["response_length"] == pytest.approx(model_tokens)
            assert all(torch.isfinite(torch.tensor(list(metrics.values()))))
    if task is guess_number:  # every turn that ends gets an answer: the games that go on hold observations
        played = [c for c in rollout.completions if c.episode.turns > 1]
        assert played and all(0 in c.mask and c.model_tokens < len(c.token_ids) for c in played)
