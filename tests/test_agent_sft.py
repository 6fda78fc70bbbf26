"""SFT on an agent task's worked traces: the model's turns (tool calls included) are trained, the tools' and the
world's replies are context only; a single-turn row is the one-turn case of the same batches."""

import random
from pathlib import Path

import pytest
import torch

import examples.calculator as calculator
from models import build_char_tokenizer
from tasks.algos.supervised import sft_loss
from tasks.common.config import SFTConfig
from tasks.data.observations import ObservationFormat
from tasks.data.problems import Example, trace_turns
from tasks.data.prompts import BARE, finished_response_ids
from tasks.stages.sft import SFTBatches


def _batches(examples: list[Example]) -> tuple[SFTBatches, object]:
    tokenizer = build_char_tokenizer()
    cfg = SFTConfig(batch_size=len(examples), max_length=256, max_prompt_length=64)
    return SFTBatches(examples, tokenizer, BARE, cfg, Path("rows.jsonl"), 0, "sft"), tokenizer


def test_a_trace_trains_the_model_turns_and_reads_the_observations_as_context():
    rng = random.Random(0)
    examples = [calculator.generate(rng, None) for _ in range(2)]
    batches, tokenizer = _batches(examples)
    ids, mask = batches.sequences[0]
    prompt = tokenizer(examples[0].prompt)["input_ids"]
    expected_ids, expected_mask = list(prompt), [0] * len(prompt)
    observations = ObservationFormat(tokenizer, False, [tokenizer.eos_token_id])
    for role, text in trace_turns(examples[0]):
        turn = finished_response_ids(tokenizer, text) if role == "assistant" else observations.encode(text)
        expected_ids += turn
        expected_mask += [int(role == "assistant")] * len(turn)
    assert (ids, mask) == (expected_ids, expected_mask)
    # the tool's answer is in the sequence, untrained; the tool call and the final answer are trained
    answer = observations.encode(examples[0].meta["turns"][1]["content"])
    start = next(i for i in range(len(ids)) if ids[i : i + len(answer)] == answer)
    assert set(mask[start : start + len(answer)]) == {0} and sum(mask) == len(ids) - len(prompt) - len(answer)


def test_the_observation_tokens_get_no_gradient():
    rng = random.Random(1)
    batches, tokenizer = _batches([calculator.generate(rng, None) for _ in range(2)])
    batch = batches[0]
    logits = torch.randn(*batch["input_ids"].shape, len(tokenizer), requires_grad=True)
    sft_loss(logits, batch["input_ids"], batch["loss_mask"]).backward()
    # logits at position t predict token t + 1: a context token's prediction gets no gradient
    predicted_context = batch["loss_mask"][:, 1:] == 0
    assert logits.grad[:, :-1][predicted_context].abs().max() == 0
    assert logits.grad[:, :-1][~predicted_context].abs().max() > 0


def test_a_single_turn_row_is_its_prompt_then_its_solution():
    row = Example("arithmetic", "12+30=", "42", "<think>2+0=2,1+3=4</think><answer>42</answer>")
    batches, tokenizer = _batches([row])
    prompt = tokenizer(row.prompt)["input_ids"]
    response = finished_response_ids(tokenizer, row.solution)
    assert batches.sequences[0] == (prompt + response, [0] * len(prompt) + [1] * len(response))


@pytest.mark.parametrize(
    ("turns", "message"),
    [
        ([{"role": "assistant", "content": "x"}], "must end on the model's final turn"),
        ([{"role": "system", "content": "x"}], "must be {'role': one of assistant, tool, user"),
        ("x", "must be a non-empty list"),
    ],
)
def test_a_malformed_trace_is_refused_saying_what_is_wrong(turns, message):
    with pytest.raises(ValueError, match=message):
        trace_turns(Example("arithmetic", "1+1=", "2", "<answer>2</answer>", {"turns": turns}))
