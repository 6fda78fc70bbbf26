"""The actor's update cut into micro-batches (``micro_batch_size``, gradient accumulation): the same step as the whole
minibatch's, for every kind of loss the learners hand it."""

from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models import load_tokenizer
from tasks.common.distributed import Rank
from tasks.data.prompts import BARE
from tasks.params.load import load_params
from tasks.rl.online_preference import PAIRS
from tasks.rl.policy_gradient import policy_gradient_loss
from tasks.rl.sequences import pack_text
from tasks.rl.workers import ActorLoss, ActorWorker, item_rows, micro_shares
from tests.conftest import REPO, tiny_model

PROMPTS = ["1+2=", "98-7=", "123*4=", "5+5="] * 3
RESPONSES = ["<think>x</think>", "<answer>91</answer>", "3", "<a>", "<think>1+2</think><answer>3</answer>", "9"] * 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("micro"))


@settings(max_examples=60, deadline=None)
@given(
    items=st.integers(1, 13),
    rows_per_item=st.sampled_from([1, 2]),
    world_size=st.integers(1, 3),
    micro=st.one_of(st.none(), st.integers(1, 8)),
    lengths=st.lists(st.integers(0, 6), min_size=26, max_size=26),
)
def test_micro_batches_cover_the_minibatch_once_and_weigh_to_its_means(
    items, rows_per_item, world_size, micro, lengths
):
    """Over every rank and micro-batch, each row of the minibatch is run once with weight (the rest with weight 0),
    every rank cuts as many micro-batches, none holds more than micro_batch_size rows, and a per-item or per-token
    mean of each micro-batch, weighted and summed, then averaged over the ranks, is the minibatch's own mean."""
    rows = items * rows_per_item
    mask = torch.zeros(rows, 6)
    for row, length in enumerate(lengths[:rows]):
        mask[row, :length] = 1
    mask[0, 0] = 1  # a minibatch with no token at all has no token mean
    values = torch.arange(rows * 6, dtype=torch.float64).view(rows, 6) ** 1.5
    minibatch = torch.arange(items)
    item_values = values[:, 0].view(rows_per_item, items).mean(0)
    per_item_total, per_token_total, counts, covered = 0.0, 0.0, set(), []
    for rank in range(world_size):
        cut = micro_shares(Rank(rank, world_size), minibatch, mask.bool(), rows_per_item, micro)
        counts.add(len(cut))
        for part_rows, per_item, per_token in cut:
            if micro is not None:
                assert len(part_rows) <= max(rows_per_item, micro // rows_per_item * rows_per_item)
            if not per_item:
                assert per_token == 0
                continue
            covered += part_rows.tolist()
            part_items = part_rows[: len(part_rows) // rows_per_item]
            per_item_total += per_item * item_values[part_items].mean().item() / world_size
            part_mask = mask[part_rows]
            token_mean = (values[part_rows] * part_mask).sum() / part_mask.sum().clamp(min=1)
            per_token_total += per_token * token_mean.item() / world_size
    assert len(counts) == 1
    assert sorted(covered) == sorted(item_rows(minibatch, items, rows_per_item).tolist())
    assert per_item_total == pytest.approx(item_values.mean().item(), rel=1e-9)
    assert per_token_total == pytest.approx(((values * mask).sum() / mask.sum()).item(), rel=1e-9)


def _updated(model_dir, section: str, loss: ActorLoss, rows: dict, overrides: list[str]):
    """One update of ``loss`` on a fixed batch with ``section``'s settings: the gradient each optimizer step took,
    the metrics, π_old's log-probs as the update reports them, and the log-probs before it."""
    defaults = ["warmup_steps=0", "kl_loss=none", "actor_lr=0.01", "epochs=1", "minibatch_size=12"]
    params = load_params(REPO / "params.yaml", [f"{section}.{o}" for o in [*defaults, *overrides]])
    cfg = getattr(params, section)
    torch.manual_seed(0)
    actor = ActorWorker(params, cfg, model_dir)
    gradients, step = [], actor.optimizer.step

    def recorded_step(*args, **kwargs):
        gradients.append(torch.cat([p.grad.flatten() for p in actor.model.parameters() if p.grad is not None]))
        return step(*args, **kwargs)

    actor.optimizer.step = recorded_step
    batch = pack_text(load_tokenizer(model_dir), BARE, PROMPTS, RESPONSES)
    before = actor.logprobs(batch)
    old = before if loss.reads_old_logprobs else None
    metrics, reported_old = actor.update(batch, loss, {name: f(batch) for name, f in rows.items()}, old)
    return gradients, metrics, reported_old * batch.response_mask, before * batch.response_mask


POLICY_GRADIENT = ActorLoss(partial(policy_gradient_loss, kl_coef=0.0))
ADVANTAGES = {"advantages": lambda batch: torch.linspace(-1.0, 1.0, len(PROMPTS))[:, None] * batch.response_mask}
REFERENCE = {"ref_logprobs": lambda batch: torch.full_like(batch.response_mask, -2.0, dtype=torch.float32)}


@pytest.mark.parametrize(
    ("section", "loss", "rows", "overrides"),
    [
        ("grpo", POLICY_GRADIENT, ADVANTAGES, []),
        ("grpo", POLICY_GRADIENT, ADVANTAGES, ["loss_agg_mode=seq_mean_token_mean", "entropy_coef=0.01"]),
        ("online_dpo", PAIRS, REFERENCE, []),
    ],
    ids=["token_mean", "seq_mean_with_entropy", "preference_pairs"],
)
def test_an_update_in_micro_batches_takes_the_whole_minibatchs_step(model_dir, section, loss, rows, overrides):
    """A minibatch of 12 rows (6 pairs) cut into micro-batches of 5 or 2 rows: the step takes the whole minibatch's
    gradient and reports its metrics (up to the order of float sums); a micro-batch as large as the minibatch is
    the same computation, bit for bit."""
    (whole,), whole_metrics, *_ = _updated(model_dir, section, loss, rows, overrides)
    assert whole.abs().max() > 1e-3
    for micro in (5, 2):
        (gradient,), metrics, *_ = _updated(model_dir, section, loss, rows, [*overrides, f"micro_batch_size={micro}"])
        assert torch.allclose(gradient, whole, rtol=1e-4, atol=1e-7), (micro, (gradient - whole).abs().max())
        assert metrics.keys() == whole_metrics.keys()
        for name, value in whole_metrics.items():
            assert metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    (gradient,), metrics, *_ = _updated(model_dir, section, loss, rows, [*overrides, "micro_batch_size=12"])
    assert torch.equal(gradient, whole) and metrics == whole_metrics


def test_without_an_old_logprob_pass_each_rows_first_micro_batch_is_its_pi_old(model_dir):
    """Two epochs over one minibatch, in micro-batches of 2 rows, with no π_old pass (a pair loss reads none): the
    log-probs the update reports are each row's first forward pass, before any step (the policy's log-probs before
    the update), not the second epoch's, one step later."""
    steps, _, reported, before = _updated(model_dir, "online_dpo", PAIRS, REFERENCE, ["epochs=2", "micro_batch_size=2"])
    assert len(steps) == 2
    assert torch.allclose(reported, before, atol=1e-5)
