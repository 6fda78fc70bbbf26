"""The one registry type behind every pick-by-name param (tasks/common/registry_type.py), and the registries the
params schema reads their choices from."""

import pickle

import pytest

from tasks.common.registry_type import Registry, UnknownName
from tasks.rl import core_algos, distill_losses, preference_losses, rewards


def _losses() -> Registry:
    registry = Registry("toy loss", needs_reference=True)

    @registry.register("first")
    def first(x: float) -> float:
        return x + 1

    registry.register("second", needs_reference=False)(abs)
    return registry


def test_a_registered_function_is_returned_as_itself_and_called_through_its_entry():
    registry = _losses()
    assert registry["first"](1.0) == 2.0 and registry["second"](-3) == 3
    assert registry["first"].function.__name__ == "first"


def test_metadata_falls_back_to_the_registrys_defaults():
    registry = _losses()
    assert registry["first"].needs_reference and not registry["second"].needs_reference
    with pytest.raises(AttributeError, match="no 'needs_critic'"):
        _ = registry["first"].needs_critic


def test_it_reads_as_a_mapping_of_names_in_registration_order():
    registry = _losses()
    assert list(registry) == ["first", "second"] and len(registry) == 2
    assert "first" in registry and "third" not in registry
    assert registry.get("third") is None
    assert [name for name, entry in registry.items() if entry.needs_reference] == ["first"]


def test_an_unknown_name_is_an_error_that_lists_the_registered_ones():
    with pytest.raises(UnknownName) as error:
        _losses()["thrid"]
    assert str(error.value) == "no toy loss 'thrid'; registered: first, second"
    assert isinstance(error.value, KeyError)


def test_a_misspelt_metadata_key_or_a_second_function_under_one_name_is_refused():
    registry = _losses()
    with pytest.raises(TypeError, match="unknown metadata \\['needs_refrence'\\]"):
        registry.register("third", needs_refrence=False)
    with pytest.raises(ValueError, match="'first' is registered already"):
        registry.register("first")


def test_an_entry_survives_pickling_as_ray_hands_it_to_a_worker():
    entry = pickle.loads(pickle.dumps(core_algos.ADVANTAGE_ESTIMATORS["gae"]))
    assert entry.needs_critic and entry.function is core_algos.gae_advantages


@pytest.mark.parametrize(
    ("registry", "names"),
    [
        (core_algos.ADVANTAGE_ESTIMATORS, {"grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"}),
        (core_algos.POLICY_LOSSES, {"ppo", "gspo", "cispo"}),
        (core_algos.LOSS_AGG_MODES, {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"}),
        (core_algos.KL_ESTIMATORS, {"k1", "k2", "k3"}),
        (preference_losses.PREFERENCE_LOSSES, {"dpo", "cdpo", "ipo", "hinge", "simpo", "orpo"}),
        (distill_losses.DISTILL_LOSSES, {"reverse_kl", "gkd"}),
        (rewards.BUILT_IN, {"accuracy", "correct", "format", "tags", "digits", "length", "overlong", "environment"}),
    ],
)
def test_every_registry_is_one_of_these(registry, names):
    assert isinstance(registry, Registry) and set(registry) == names
