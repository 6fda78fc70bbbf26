"""Multi-turn episodes: token-exact sequences through the HF and vLLM engines, tools and environments run sandboxed
(a hang, a crash, a huge answer, a malformed call each counted, never fatal)."""

import importlib
import json
import multiprocessing
import sys
import textwrap
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from test_chat_tokens import TEMPLATE, bpe_model  # noqa: F401 (a fixture: SmolLM2's tokenizer on a tiny Llama)
from transformers import LlamaForCausalLM

from models import build_char_tokenizer, build_tiny_llama, load_policy, load_tokenizer
from tasks.algos.supervised import sft_loss
from tasks.algos.tokens import token_logprobs
from tasks.common.config import BaseConfig, Params, VLLMConfig
from tasks.common.training import make_deterministic
from tasks.data.environments import check_tool_tags
from tasks.data.problems import Example, TaskError
from tasks.data.prompts import BARE
from tasks.rollout.engine import Completion, Sampling
from tasks.rollout.episodes import episode_tensors, run_episodes
from tasks.rollout.hf_engine import HFEngine
from tasks.stages.eval import evaluate

TOOLBOX = """
import os, time
from tasks.data.environments import Tool

NUMBERS = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}
NOTHING = {"type": "object", "properties": {}}

def add(a, b):
    return {"sum": a + b}

def hang():
    time.sleep(600)

def boom():
    raise RuntimeError("boom")

def huge():
    return "x" * 10_000_000

def crash():
    os._exit(3)

def nan():
    return {"x": float("nan")}

TOOLS = [
    Tool("add", "Add two numbers.", NUMBERS, add),
    *(Tool(f.__name__, "Misbehaves.", NOTHING, f) for f in (hang, boom, huge, crash, nan)),
]

def score(example, response):
    return True, response.strip() == example.answer

def difficulty(example):
    return "any"
"""

# An environment that always answers, so a random model plays every turn it is allowed.
ECHO = """
from tasks.data.environments import Step

class Echo:
    def reset(self, example):
        return "Say something."

    def step(self, action):
        return Step(f"heard {len(action)} characters", reward=1.0)

def environment(example):
    return Echo()

def score(example, response):
    return True, False

def difficulty(example):
    return "any"
"""

FILES = ["data.train_file=data/agent/train.jsonl", "data.test_file=data/agent/test.jsonl"]
# A world with state: it counts the turns it saw; one turn hangs it.
COUNTER = """
import time
from tasks.data.environments import Step

class Counter:
    def reset(self, example):
        self.count = 0

    def step(self, action):
        if action == "hang":
            time.sleep(600)
        self.count += 1
        return Step(f"count {self.count}", reward=0.5, done=action == "stop")

def environment(example):
    return Counter()

def score(example, response):
    return True, response == "stop"

def difficulty(example):
    return "any"
"""

# The counter, drawing a secret at reset without a seed: a replay after a crash rebuilds another world.
DRIFTING = COUNTER.replace("import time", "import random, time").replace(
    "        self.count = 0", "        self.count = random.randrange(10**9)"
)
# A tool reading its example's hidden price list (no environment of the task's own).
SHOP = """
from tasks.data.environments import Tool

def price(item, example):
    return str(example.meta["prices"][item])

TOOLS = [Tool("price", "The unit price of an item.", {"type": "object", "properties": {"item": {"type": "string"}},
    "required": ["item"]}, price)]

def score(example, response):
    return True, False

def difficulty(example):
    return "any"
"""
EXAMPLES = [Example("t", "12+34=", "46", "46"), Example("t", "7*8=", "56", "56")]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> SimpleNamespace:
    """The task modules above, importable here and in the sandbox process (which inherits sys.path)."""
    folder = tmp_path_factory.mktemp("agent_tasks")
    modules = {}
    sources = {
        "toolbox_task": TOOLBOX,
        "echo_task": ECHO,
        "counter_task": COUNTER,
        "drifting_task": DRIFTING,
        "shop_task": SHOP,
    }
    for name, source in sources.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(folder))
    for name in sources:
        modules[name.removesuffix("_task")] = importlib.import_module(name)
    return SimpleNamespace(**modules)


class Scripted:
    """An engine that answers each context's k-th turn with the k-th of ``turns`` (text, or ids as sampled; a tuple:
    one per context in play)."""

    def __init__(self, tokenizer, turns: list[str | list[int]]):
        self.tokenizer, self.prompt_format, self.turns = tokenizer, BARE, turns
        self.stop_ids = [tokenizer.eos_token_id]
        self.calls = 0

    def generate_ids(self, prompt_ids: list[list[int]], sampling: Sampling) -> list[Completion]:
        turns, self.calls = self.turns[self.calls], self.calls + 1
        rows = [(index, prompt) for index, prompt in enumerate(prompt_ids) for _ in range(sampling.n)]
        turns = turns if isinstance(turns, tuple) else (turns,) * len(rows)
        return [self.completion(index, prompt, turn) for (index, prompt), turn in zip(rows, turns, strict=True)]

    def completion(self, index: int, prompt: list[int], turn: str | list[int]) -> Completion:
        ids = turn if isinstance(turn, list) else self.tokenizer(turn, add_special_tokens=False)["input_ids"]
        ids = [*ids, self.tokenizer.eos_token_id]
        return Completion(index, prompt, ids, self.tokenizer.decode(ids, skip_special_tokens=True), [-0.5] * len(ids))


class Recording:
    """An engine's proxy keeping every completion it sampled, in call order."""

    def __init__(self, engine):
        self.engine, self.sampled = engine, []
        self.tokenizer, self.prompt_format, self.stop_ids = engine.tokenizer, engine.prompt_format, engine.stop_ids

    def generate_ids(self, prompt_ids: list[list[int]], sampling: Sampling) -> list[Completion]:
        completions = self.engine.generate_ids(prompt_ids, sampling)
        self.sampled.append(completions)
        return completions


def call(name: str, arguments: str = "{}") -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def segments(episode) -> list[tuple[int, list[int]]]:
    """The episode's ids in runs of equal mask: (mask, ids) alternating prompt/observation and model turns."""
    runs = []
    for token, flag in zip(episode.token_ids, episode.mask, strict=True):
        if runs and runs[-1][0] == flag:
            runs[-1][1].append(token)
        else:
            runs.append((flag, [token]))
    return runs


def test_a_failing_tool_is_an_error_observation_and_the_episode_goes_on(tasks):
    tokenizer = build_char_tokenizer()
    turns = [
        call("hang"),
        call("boom"),
        call("huge"),
        call("crash"),
        '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>',  # invalid JSON
        call("subtract", '{"a": 1, "b": 2}'),
        call("add", '{"a": 1, "c": 2}'),
        call("add", '{"a": 1, "b": 2}'),
        "46",
    ]
    (episode,) = run_episodes(
        Scripted(tokenizer, turns), EXAMPLES[:1], tasks.toolbox, Sampling(64), 10, 4096, tool_timeout_seconds=2.0
    )
    assert (episode.turns, episode.tool_calls, episode.tool_errors) == (9, 8, 7)
    assert not episode.truncated and not episode.hit_max_turns and episode.final_text == "46"
    observations = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert "over agent.tool_timeout_seconds=2" in observations[0]
    assert "RuntimeError: boom" in observations[1]
    assert "10000000 characters, over agent.tool_output_chars=10000" in observations[2]
    assert "its process died" in observations[3]
    assert "not valid JSON" in observations[4]
    assert "there is no tool 'subtract'" in observations[5]
    assert "unknown argument 'c'" in observations[6] and "missing argument 'b'" in observations[6]
    assert observations[7] == '{"sum": 3}'  # after a hang and a crash, a fresh sandbox serves the next call


def test_a_world_that_hangs_ends_its_episode_and_the_others_keep_their_state(tasks):
    scripted = Scripted(build_char_tokenizer(), ["go", ("hang", "go"), "go", "stop"])
    hung, replayed = run_episodes(scripted, EXAMPLES, tasks.counter, Sampling(64), 5, 4096, tool_timeout_seconds=2.0)
    assert (hung.turns, hung.tool_errors, hung.env_reward, hung.truncated) == (2, 1, 0.5, False)
    assert "over agent.tool_timeout_seconds=2" in hung.messages[-1]["content"]
    # rebuilt in the fresh sandbox by replaying its two turns: it counts on from there
    assert [m["content"] for m in replayed.messages if m["role"] == "tool"] == [f"count {k}" for k in (1, 2, 3, 4)]
    assert (replayed.turns, replayed.tool_errors, replayed.env_reward, replayed.final_text) == (4, 0, 2.0, "stop")


def test_a_world_that_replays_differently_ends_its_episode_naming_the_nondeterminism(tasks):
    """A world that draws its secret without a seed is rebuilt with another after a sandbox crash: the replay
    answers differently from the first time, which ends that episode as a tool error naming the module (here the
    batch's other episode hung, so every episode failed, and the error lists both)."""
    scripted = Scripted(build_char_tokenizer(), ["go", ("hang", "go"), "go", "stop"])
    with pytest.raises(TaskError) as raised:
        run_episodes(scripted, EXAMPLES, tasks.drifting, Sampling(64), 5, 4096, tool_timeout_seconds=2.0)
    message = str(raised.value)
    assert "over agent.tool_timeout_seconds=2" in message
    assert "drifting_task.environment().step() failed" in message
    assert "environment() is not deterministic given its example and actions" in message


def test_a_batch_whose_every_episode_failed_on_the_environment_is_an_error_naming_the_first(tasks):
    scripted = Scripted(build_char_tokenizer(), ["hang"])
    with pytest.raises(TaskError, match=r"every one of 2 episodes failed on counter_task.environment\(\): "):
        run_episodes(scripted, EXAMPLES, tasks.counter, Sampling(64), 5, 4096, tool_timeout_seconds=1.0)


def test_an_episode_budget_below_the_longest_prompt_is_an_error_naming_the_key(tasks):
    scripted = Scripted(build_char_tokenizer(), ["46"])
    with pytest.raises(TaskError, match="agent.max_total_tokens: an episode of at most 5 tokens"):
        run_episodes(scripted, EXAMPLES, tasks.toolbox, Sampling(64), 5, 5)


def test_a_tool_that_takes_the_example_reads_the_episodes_hidden_data(tasks):
    """A tool function taking ``example`` is handed the episode's Example: a per-row price list in ``meta``, which
    the model never sees, with no environment of the task's own."""
    tokenizer = build_char_tokenizer()
    rows = [replace(EXAMPLES[0], meta={"prices": {"pen": 3}}), replace(EXAMPLES[1], meta={"prices": {"pen": 5}})]
    scripted = Scripted(tokenizer, [call("price", '{"item": "pen"}'), "done"])
    episodes = run_episodes(scripted, rows, tasks.shop, Sampling(64), 5, 4096)
    assert [[m["content"] for m in e.messages if m["role"] == "tool"] for e in episodes] == [["3"], ["5"]]
    assert all(e.tool_errors == 0 for e in episodes)


def test_eval_of_a_tool_task_grades_episodes_on_their_final_turn(tasks):
    params = Params()
    scripted = Scripted(build_char_tokenizer(), [call("add", '{"a": 1, "b": 2}'), "46", call("boom"), "7"])
    example = replace(EXAMPLES[0], task="toolbox_task")
    metrics, rows = evaluate(scripted, [example], replace(params.eval, k=2), params.agent, 4096)
    assert metrics["pass@1"] == 1.0 and metrics["sample_accuracy"] == 0.0  # greedy: 46, sampled: 7 twice
    assert (metrics["turns"], metrics["tool_calls"], metrics["tool_errors"], metrics["max_turns_rate"]) == (2, 1, 0, 0)
    (row,) = rows
    assert (
        row["response"] == "46"
        and row["correct"]
        and json.loads(json.dumps(row))["messages"][2]
        == {
            "role": "tool",
            "content": '{"sum": 3}',
            "reward": 0.0,
        }
    )


def test_an_episode_that_keeps_calling_stops_at_max_turns(tasks):
    tokenizer = build_char_tokenizer()
    scripted = Scripted(tokenizer, [call("add", '{"a": 1, "b": 2}')] * 3)
    (episode,) = run_episodes(scripted, EXAMPLES[:1], tasks.toolbox, Sampling(64), 2, 4096)
    assert episode.hit_max_turns and (episode.turns, episode.tool_calls, episode.tool_errors) == (2, 2, 0)
    assert scripted.calls == 2


def test_observation_tokens_are_masked_out_of_the_loss(tasks):
    tokenizer = build_char_tokenizer()
    scripted = Scripted(tokenizer, [call("add", '{"a": 1, "b": 2}'), "3"])
    (episode,) = run_episodes(scripted, EXAMPLES[:1], tasks.toolbox, Sampling(64), 4, 4096)
    prompt, first, observation, last = segments(episode)
    assert [prompt[0], first[0], observation[0], last[0]] == [0, 1, 0, 1]
    assert tokenizer.decode(observation[1]) == '\n<tool_response>{"sum": 3}</tool_response>\n'
    assert [p for p, m in zip(episode.logprobs, episode.mask, strict=True) if not m] == [0.0] * (
        len(prompt[1]) + len(observation[1])
    )

    input_ids, attention_mask, loss_mask = episode_tensors([episode], tokenizer.pad_token_id)
    logits = torch.randn(1, input_ids.shape[1], len(tokenizer), requires_grad=True)
    sft_loss(logits, input_ids, loss_mask).backward()
    predicting = logits.grad[0, :-1].abs().sum(-1)  # position t predicts token t + 1
    target_mask = torch.tensor(episode.mask[1:])
    assert (predicting[target_mask == 0] == 0).all()  # no gradient towards the prompt or the observation
    assert (predicting[target_mask == 1] > 0).all()


def test_episode_ids_are_the_sampled_ids_never_decoded_and_encoded_again(bpe_model, tasks):  # noqa: F811
    tokenizer = load_tokenizer(bpe_model)
    # "hello" sampled as "h" + "ello": the text it decodes to encodes as other ids.
    sampled = (
        tokenizer("h", add_special_tokens=False)["input_ids"] + tokenizer("ello", add_special_tokens=False)["input_ids"]
    )
    assert tokenizer(tokenizer.decode(sampled), add_special_tokens=False)["input_ids"] != sampled
    scripted = Scripted(tokenizer, [call("add", '{"a": 1, "b": 2}'), sampled])
    scripted.prompt_format, scripted.stop_ids = TEMPLATE, [tokenizer.eos_token_id]
    (episode,) = run_episodes(scripted, EXAMPLES[:1], tasks.toolbox, Sampling(64), 4, 4096)
    *_, observation, last = segments(episode)
    assert last == (1, [*sampled, tokenizer.eos_token_id])
    # The observation is the template's tool turn, then the assistant's header: the model's <|im_end|> came sampled.
    assert tokenizer.decode(observation[1]) == ('\n<|im_start|>tool\n{"sum": 3}<|im_end|>\n<|im_start|>assistant\n')
    check_tool_tags(tasks.toolbox, tokenizer)


def test_hf_episodes_carry_the_sampled_ids_and_the_trainers_logprobs(bpe_model, tasks):  # noqa: F811
    make_deterministic(0)
    model, tokenizer = LlamaForCausalLM.from_pretrained(bpe_model), load_tokenizer(bpe_model)
    ending_often(model, tokenizer.eos_token_id)
    engine = Recording(HFEngine(model, tokenizer, 8, TEMPLATE))
    episodes = run_episodes(engine, EXAMPLES, tasks.echo, Sampling(12, n=2, temperature=0.8), 3, 4096)
    assert [e.prompt_index for e in episodes] == [0, 0, 1, 1]
    assert_token_exact(episodes, engine.sampled, model, temperature=0.8)


def ending_often(model, eos_id: int, steps: int = 6) -> None:
    """A few AdamW steps towards end-of-sequence after anything: a random model would hardly ever end a turn, and a
    turn that does not end ends its episode."""
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-2)
    ids = torch.randint(0, model.config.vocab_size, (4, 16))
    for _ in range(steps):
        (-torch.log_softmax(model(input_ids=ids).logits, -1)[..., eos_id].mean()).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def assert_token_exact(episodes, sampled: list[list[Completion]], model, temperature: float) -> None:
    """Each episode's model turns are the engine's sampled ids, round by round, and a forward pass over the whole
    sequence gives the engine's log-prob of each (what PPO's ratio compares)."""
    assert max(e.turns for e in episodes) == 3 and len(sampled) == 3
    for turn, completions in enumerate(sampled):
        playing = [e for e in episodes if e.turns > turn]  # in order: a finished episode leaves the batch
        for episode, completion in zip(playing, completions, strict=True):
            assert [ids for flag, ids in segments(episode) if flag][turn] == completion.token_ids
    for episode in episodes:
        assert episode.env_reward == episode.turns - episode.truncated  # the echo rewards each turn that ended
        ids = torch.tensor([episode.token_ids])
        with torch.no_grad():
            logprobs = token_logprobs(model(input_ids=ids).logits[:, :-1] / temperature, ids[:, 1:])[0]
        mask = torch.tensor(episode.mask[1:]).bool()
        assert torch.allclose(logprobs[mask], torch.tensor(episode.logprobs[1:])[mask], atol=1e-3)


def test_a_single_turn_task_is_the_one_turn_episode_of_exactly_the_engines_completion(bpe_model, tasks):  # noqa: F811
    """The RL rollout, eval and rejection sampling play every task's episodes: a task without tools or a world gets
    the engine's completions as they came, starting no sandbox process."""
    model, tokenizer = LlamaForCausalLM.from_pretrained(bpe_model), load_tokenizer(bpe_model)
    engine = HFEngine(model, tokenizer, 8, TEMPLATE)
    sampling = Sampling(8, n=3, temperature=0.9)
    make_deterministic(0)
    completions = engine.generate([e.prompt for e in EXAMPLES], sampling)
    make_deterministic(0)
    plain = importlib.import_module("tasks.data.problems.arithmetic")
    episodes = run_episodes(engine, EXAMPLES, plain, sampling, 4, 4096)
    assert [episode.completion() for episode in episodes] == completions  # no turns to report: episode None
    assert not multiprocessing.active_children()
    for completion, episode in zip(completions, episodes, strict=True):
        assert episode.token_ids == completion.prompt_ids + completion.token_ids
        assert episode.final_text == completion.text and episode.turns == 1 and episode.tool_calls == 0


@pytest.mark.slow
def test_vllm_engine_plays_the_same_episodes_through_the_same_interface(tmp_path, tasks):
    pytest.importorskip("vllm")
    from tasks.rollout.vllm_engine import VLLMEngine

    tokenizer = build_char_tokenizer()
    # head_dim 32: the smallest head size vLLM's CPU attention supports.
    config = BaseConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_position_embeddings=512)
    model = build_tiny_llama(config, tokenizer, seed=0)
    ending_often(model, tokenizer.eos_token_id, steps=3)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = Recording(VLLMEngine(tmp_path, 0, 512, BARE, settings=VLLMConfig(enforce_eager=True)))
    episodes = run_episodes(engine, EXAMPLES, tasks.echo, Sampling(16, n=2, temperature=0.8), 3, 512)
    assert_token_exact(episodes, engine.sampled, load_policy(tmp_path, torch.device("cpu")), temperature=0.8)


def test_an_unclosed_call_and_a_result_json_cannot_carry_are_tool_errors_not_answers(tasks):
    """A turn that opens <tool_call> and never closes it is a malformed call (answered, counted), not the final
    answer; a tool returning NaN gets an error observation, never the invalid JSON 'NaN'."""
    tokenizer = build_char_tokenizer()
    turns = ['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}', call("nan"), "46"]
    (episode,) = run_episodes(Scripted(tokenizer, turns), EXAMPLES[:1], tasks.toolbox, Sampling(64), 10, 4096)
    assert (episode.turns, episode.tool_calls, episode.tool_errors) == (3, 2, 2)
    assert episode.final_text == "46"
    observations = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert "the tool call is not closed with </tool_call>" in observations[0]
    assert "holds a NaN or an infinity, which JSON cannot carry" in observations[1]
    assert "NaN" not in observations[1].replace("a NaN", "")


def test_rejection_sampling_keeps_an_accepted_episodes_turns_as_the_next_sfts_trace(tasks, monkeypatch):
    import tasks.stages.rejection_sampling as rejection
    from tasks.common.config import RejectionSamplingConfig
    from tasks.data.problems import trace_turns

    example = replace(EXAMPLES[0], task="toolbox_task")
    # two episodes of the one prompt: a tool call then the right answer, and a wrong answer at once
    scripted = Scripted(build_char_tokenizer(), [(call("add", '{"a": 12, "b": 34}'), "45"), "46"])
    monkeypatch.setattr(rejection, "policy_engine", lambda *args, **kwargs: scripted)
    cfg = RejectionSamplingConfig(samples_per_prompt=2, max_new_tokens=64)
    params = replace(Params(), agent=replace(Params().agent, max_total_tokens=4096))
    kept, statistics = rejection.sample_and_verify(params, cfg, "rejection", None, [example], "rows.jsonl")
    assert statistics["acceptance_rate"] == 0.5
    (row,) = kept
    assert row.solution == "46"
    assert trace_turns(row) == [
        ("assistant", call("add", '{"a": 12, "b": 34}')),
        ("tool", '{"sum": 46}'),
        ("assistant", "46"),
    ]
