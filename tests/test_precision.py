"""precision: auto: bf16 where the device computes bfloat16 natively, float32 elsewhere, resolved as a stage starts."""

from pathlib import Path

import pytest

import models.trainable
from tasks.common.config import Params
from tasks.common.registry import with_precisions_resolved
from tasks.params.load import load_params

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("native", "trained", "sampled"), [(True, "bf16-mixed", "bf16"), (False, "fp32", "fp32")])
def test_auto_becomes_bf16_where_it_is_native_and_fp32_elsewhere(monkeypatch, native, trained, sampled):
    monkeypatch.setattr(models.trainable, "native_bf16", lambda device: native)
    overrides = ["sft.precision=auto", "grpo.precision=auto", "eval.precision=auto", "dpo.precision=bf16"]
    params = with_precisions_resolved(load_params(REPO / "params.yaml", overrides))
    assert (params.sft.precision, params.grpo.precision, params.eval.precision) == (trained, trained, sampled)
    assert params.dpo.precision == "bf16" and params.ppo.precision == "fp32"  # what was stated stays
    assert not any(
        getattr(params, name).precision == "auto"
        for name in vars(params)
        if hasattr(getattr(params, name), "precision")
    )


def test_auto_is_accepted_where_bf16_would_be_refused(monkeypatch):
    """On a GPU without bfloat16, bf16 is an error naming the key; auto is fp32 there."""
    import tasks.params.training_rules as rules

    monkeypatch.setattr(rules, "_device_runs_bf16", lambda device: False)
    assert isinstance(load_params(REPO / "params.yaml", ["sft.precision=auto"]), Params)
    with pytest.raises(ValueError, match="sft.precision: bf16-mixed needs bfloat16"):
        load_params(REPO / "params.yaml", ["sft.precision=bf16-mixed"])
