"""The HF engine's compiled decoding step (static caches per batch bucket) against its eager one."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import DynamicCache

from models import load_policy, load_tokenizer
from tasks.common.config import ConfigError
from tasks.data.prompts import BARE
from tasks.params.load import load_params
from tasks.rollout.decoding import SMALLEST_BUCKET, CompiledDecoder, CompiledSteps, bucket, compiled_decoding
from tasks.rollout.engine import Sampling
from tasks.rollout.hf_engine import HFEngine
from tests.conftest import REPO, tiny_model

PROMPTS = ["1+2=", "123*4=", "98-7=", "5=", "77+3=", "6*6=", "40-13=", "2+2+2="]


@pytest.fixture(scope="module")
def talkative(tmp_path_factory):
    """A random model whose rows end at many different steps: weights large enough that continuations depend on
    the prompt and the draw, and as its end-of-sequence the token (none of the prompts') that would end the most rows,
    at the most different steps."""
    model_dir = tiny_model(tmp_path_factory.mktemp("tiny"))
    model, tokenizer = load_policy(model_dir, torch.device("cpu")).eval(), load_tokenizer(model_dir)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    torch.manual_seed(0)
    said = [c.token_ids for c in HFEngine(model, tokenizer, 8, BARE).generate(PROMPTS, Sampling(24, n=4))]

    def ends(token: int) -> list[int]:
        return [ids.index(token) for ids in said if token in ids]

    in_prompts = {token for prompt in PROMPTS for token in tokenizer(prompt)["input_ids"]}
    vocabulary = {token for ids in said for token in ids} - in_prompts
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(
        max(sorted(vocabulary), key=lambda t: (len(ends(t)), len(set(ends(t)))))
    )
    return model, tokenizer


def _both(model, tokenizer, sampling: Sampling) -> tuple[list, list, HFEngine]:
    """The eager engine's completions and the compiled one's, each from seed 0, and the compiled engine."""
    eager, compiled = HFEngine(model, tokenizer, 8, BARE), HFEngine(model, tokenizer, 8, BARE, compiled=True)
    results = []
    for engine in (eager, compiled):
        torch.manual_seed(0)
        results.append(engine.generate(PROMPTS, sampling))
    return *results, compiled


@pytest.mark.slow
def test_compiled_decoding_samples_what_eager_decoding_samples(talkative):
    """Rows ending at different steps (so the batch moves to smaller buckets): the same tokens from the same seed,
    their log-probs equal to compilation's rounding, and each completion's end where the eager engine puts it."""
    expected, got, compiled = _both(*talkative, Sampling(64, n=4, temperature=1.0))
    assert len({len(c.token_ids) for c in expected}) >= 16, "rows should end at different steps"
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert [c.truncated for c in got] == [c.truncated for c in expected]
    for a, b in zip(got, expected, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    buckets = {rows for rows, _, _ in compiled.compiled.caches}
    assert buckets == {32, 16, 8}, "32 rows should have moved to smaller buckets as they ended"


def test_compiled_greedy_decoding_is_eager_greedy_decoding(talkative):
    expected, got, _ = _both(*talkative, Sampling(64, greedy=True))
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    for a, b in zip(got, expected, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_a_second_rollout_reuses_the_buckets_caches(talkative):
    """The static caches live as long as the engine (a GPU's captured graphs replay on the same buffers)."""
    model, tokenizer = talkative
    engine = HFEngine(model, tokenizer, 8, BARE, compiled=True)
    engine.generate(PROMPTS[:2], Sampling(24, n=4, greedy=True))
    caches = dict(engine.compiled.caches)
    engine.generate(PROMPTS[:2], Sampling(24, n=4, greedy=True))
    assert engine.compiled.caches.keys() == caches.keys()
    assert all(engine.compiled.caches[key] is cache for key, cache in caches.items())


def test_the_last_rows_ending_together_leave_the_bucket_as_it_is(talkative):
    model, _ = talkative
    rows, width = 16, 5
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.randint(3, 20, (rows, width)), past_key_values=cache, use_cache=True)
    mask, position = torch.ones(rows, width, dtype=torch.long), torch.full((rows, 1), width)
    decoder = CompiledDecoder(model, cache, mask, position, 8, CompiledSteps(model.device))
    decoder.keep(torch.arange(rows)[:0])
    assert len(decoder.tokens) == rows and len(decoder.slots) == 0


@given(st.integers(1, 5000))
def test_a_bucket_is_the_next_power_of_two_from_the_smallest(rows):
    size = bucket(rows)
    assert size >= rows and size >= SMALLEST_BUCKET
    assert size & (size - 1) == 0
    assert size == SMALLEST_BUCKET or size < 2 * rows


@pytest.mark.parametrize(("decoding", "compiled"), [("auto", False), ("compiled", True), ("eager", False)])
def test_decoding_auto_compiles_on_a_gpu_only(decoding, compiled):
    params = load_params(REPO / "params.yaml", [f"decoding={decoding}", "device=cpu"])
    assert compiled_decoding(params) is compiled


def test_an_unknown_decoding_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="decoding"):
        load_params(REPO / "params.yaml", ["decoding=fast"])
