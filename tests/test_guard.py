"""The over-optimisation guard on the tiny model: a training reward made to be exploited, a judge that was not."""

import csv
import dataclasses
import json

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from tasks.data.datasets import read_examples, read_preferences, write_jsonl
from tasks.data.judge import gold_utility
from tasks.data.problems import score_response
from tasks.params.load import load_params
from tasks.rollout.engine import Sampling
from tasks.rollout.hf_engine import policy_engine
from tests.conftest import dvc, make_project, report_json

pytestmark = pytest.mark.slow

# A tiny model that learns the answer format of 2-digit additions (gold about 0.3: formatted, mostly wrong), so a
# policy can get worse; pairs labelled without noise, so the judge learns the judge's order.
LEARNS_THE_FORMAT = (
    "task.name=arithmetic",
    "task.arithmetic.digits=2",
    "task.arithmetic.ops=+",
    "data.num_train=2000",
    "data.num_test=64",
    "base.hidden_size=64",
    "base.num_layers=2",
    "base.intermediate_size=128",
    "sft_cold.max_steps=400",
    "sft_cold.num_examples=2000",
    "sft_cold.lr=3e-3",
    "preferences.judge.label_noise=0.0",
    "reward_model.kind=classifier",
    "reward_model.epochs=4",
    "reward_model.lr=1e-3",
    "ppo.steps=8",
    "ppo.actor_lr=1e-3",
    "ppo.kl_target=null",
    "ppo.kl_coef=0.0",
    "ppo.guard.every=2",
    "ppo.guard.prompts=32",
)


def curve(path, name: str) -> list[float]:
    """Every iteration's ``name`` as the stage logged it for ``dvc plots``."""
    with open(path / f"metrics/ppo/plots/metrics/train/{name}.tsv") as rows:
        return [float(row[name]) for row in csv.DictReader(rows, delimiter="\t")]


@pytest.fixture(scope="module")
def exploited(tmp_path_factory) -> dict:
    """PPO on a reward model that learned the judge's labels reversed (the worse response chosen), its judge
    trained on the held-out pairs as labelled."""
    path = make_project(tmp_path_factory.mktemp("guard"), LEARNS_THE_FORMAT)
    dvc(path, "repro", "preferences")
    honest = read_preferences(path / "artifacts/preferences/train.jsonl")
    reversed_pairs = [dataclasses.replace(p, chosen=p.rejected, rejected=p.chosen, meta={}) for p in honest]
    (path / "data").mkdir(exist_ok=True)
    write_jsonl(path / "data/reversed.jsonl", reversed_pairs)
    params = OmegaConf.load(path / "params.yaml")
    params.preferences.train_file = "data/reversed.jsonl"
    OmegaConf.save(params, path / "params.yaml")
    output = dvc(path, "repro", "ppo")
    return {"path": path, "output": output}


def test_the_guard_keeps_an_earlier_iteration_when_the_training_reward_is_exploited(exploited):
    """PPO raises the exploited reward and lowers the gold one. The guard keeps the probe the judge rates best, and
    that probe's gold reward (logged for this test, never read by the guard) is above the last iteration's."""
    path, output = exploited["path"], exploited["output"]
    guard = json.loads((path / "artifacts/ppo/guard.json").read_text())
    probes = {probe["step"]: probe for probe in guard["probes"]}
    assert sorted(probes) == [0, 2, 4, 6, 8]
    assert guard["signal"] == "judge"
    kept = guard["kept_iteration"]
    # the guard's choice is the judge's best probe (the earliest of equals), and nothing else
    assert kept == max(probes, key=lambda step: (probes[step]["guard/score"], -step))
    assert kept < 8, guard
    assert probes[kept]["guard/gold_reward"] > probes[8]["guard/gold_reward"] + 0.03, guard
    rewards = curve(path, "reward")
    assert rewards[-1] > rewards[0] + 1.0  # the exploited reward rose all the while
    assert f"ppo: guard: iteration {kept}'s probe scored" in output
    assert report_json(path)["ppo"]["guard/kept_iteration"] == kept
    if kept == 0:  # the artifact is the kept iteration's policy: here the start's, tensor for tensor
        start, saved = (AutoModelForCausalLM.from_pretrained(path / f"artifacts/{m}") for m in ("sft_cold", "ppo"))
        expected = start.state_dict()
        assert all(torch.equal(tensor, expected[name]) for name, tensor in saved.state_dict().items())


def test_the_stage_stops_updating_once_the_kl_passes_its_budget(exploited):
    """With kl_budget_stop, the run ends at the first iteration whose KL from the reference passes kl_budget (a
    budget between the third and the fourth iterations' KL of the run above): it logs that iteration as
    stopped_at, and the guard probes it before choosing."""
    path = exploited["path"]
    kl = curve(path, "kl")
    assert kl[2] < kl[3]
    budget = (kl[2] + kl[3]) / 2
    params = OmegaConf.load(path / "params.yaml")
    params.ppo.kl_budget_stop, params.ppo.kl_budget = True, budget
    OmegaConf.save(params, path / "params.yaml")
    output = dvc(path, "repro", "ppo")
    assert f"passed kl_budget={budget}: stop" in output
    metrics = json.loads((path / "metrics/ppo/metrics.json").read_text())
    assert metrics["stopped_at"] == 4
    assert curve(path, "kl") == kl[:4]
    guard = json.loads((path / "artifacts/ppo/guard.json").read_text())
    assert [probe["step"] for probe in guard["probes"]] == [0, 2, 4]


def test_a_greedy_held_out_probe_reads_greedy_answers_to_the_prompts_training_never_draws(exploited, monkeypatch):
    """With guard.greedy and guard.held_out, the probe before the first iteration is the start model's greedy answer
    to each of the training split's last guard.prompts: its gold reward and verifier score are those of sft_cold's
    greedy answers to exactly those prompts (decoded here apart), not to the first ones."""
    path = exploited["path"]
    params = OmegaConf.load(path / "params.yaml")
    params.ppo.kl_budget_stop, params.ppo.steps, params.ppo.guard.every = False, 2, 1
    params.ppo.guard.signal, params.ppo.guard.prompts = "verifier", 16
    params.ppo.guard.greedy = params.ppo.guard.held_out = True
    OmegaConf.save(params, path / "params.yaml")
    dvc(path, "repro", "ppo")
    guard = json.loads((path / "artifacts/ppo/guard.json").read_text())
    assert [probe["step"] for probe in guard["probes"]] == [0, 1, 2]
    monkeypatch.chdir(path)  # params name the project's files relative to it
    typed = load_params(path / "params.yaml")
    engine = policy_engine(typed, path / "artifacts/sft_cold", {}, "ppo")
    train = read_examples(path / "artifacts/data/train.jsonl")

    def greedy_probe(examples: list) -> tuple[float, float]:
        answers = engine.generate([e.prompt for e in examples], Sampling(typed.ppo.max_new_tokens, greedy=True))
        gold = [gold_utility(examples[a.prompt_index], a.text) for a in answers]
        correct = [score_response(examples[a.prompt_index], a.text)[1] for a in answers]
        return sum(correct) / len(correct), sum(gold) / len(gold)

    held_out, first = greedy_probe(train[-16:]), greedy_probe(train[:16])
    assert held_out != first  # else the probe's prompts could not be told apart here
    start = guard["probes"][0]
    assert (start["guard/score"], start["guard/gold_reward"]) == pytest.approx(held_out, abs=1e-9)


def test_too_few_held_out_pairs_for_a_judge_is_a_warning_and_no_judge(tmp_path):
    """A held-out split smaller than a batch trains no judge: reward_model says so and the guard's auto is none."""
    path = make_project(tmp_path, ("preferences.test_file=data/one_pair.jsonl",))
    honest_pair = {"prompt": "1+1=", "chosen": "<answer>2</answer>", "rejected": "<answer>3</answer>", "meta": {}}
    (path / "data/one_pair.jsonl").write_text(json.dumps(honest_pair) + "\n")
    output = dvc(path, "repro", "reward_model")
    assert "reward_model.judge: 1 held-out pairs, fewer than reward_model.batch_size=8: no judge" in output
    assert not (path / "artifacts/reward_model/judge").exists()
    assert (path / "artifacts/reward_model/member-0").is_dir()
