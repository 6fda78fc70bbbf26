"""The offline-to-online pipeline end to end on a tiny configuration: pairs -> reference log-probs -> offline DPO
-> online DPO -> eval, what DVC re-runs when a knob changes, and resumption."""

import json
import re
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from models import load_tokenizer
from tasks.data.datasets import read_examples, read_preferences
from tasks.data.judge import preference_metrics
from tasks.data.prompts import BARE
from tasks.rl.preference import pack_pairs, pair_logprobs, tokenize_pairs
from tasks.rl.preference_losses import preference_loss
from tests.conftest import dvc, make_project, report_json, repro, resume_after_kill, stages_run, warm

pytestmark = pytest.mark.slow

STAGES = {
    *("data", "base", "sft_cold", "preferences", "dpo_reference", "dpo", "online_dpo"),
    *("eval@base", "eval@sft_cold", "eval@dpo", "eval@online_dpo"),
}


@pytest.fixture(scope="module")
def o2o(tmp_path_factory) -> dict:
    # The tiny policy rarely solves a problem: a length reward makes a group's responses differ, so every
    # iteration has pairs to learn from whatever the seed.
    rewards = "online_dpo.rewards={accuracy: 1.0, format: 0.1, length: 0.1}"
    path = make_project(tmp_path_factory.mktemp("o2o"), (rewards,))
    output = repro(path, "offline_to_online")
    return {"path": path, "output": output, "weights": (path / "artifacts/dpo/model.safetensors").read_bytes()}


def test_the_pipeline_runs_every_stage_and_reports_each_models_gold_reward_and_the_dip(o2o):
    path = o2o["path"]
    assert stages_run(o2o["output"]) == STAGES
    report = report_json(path)
    for model in ("sft_cold", "dpo", "online_dpo"):
        assert {"gold_reward", "pass@1"} <= set(report[model]), model
    online = report["online_dpo"]
    assert online["dip"] >= 0 and (online["recovery_iterations"] is None or online["recovery_iterations"] >= 0)
    monitored = {f"train/{name}" for name in ("preference_loss", "gold_reward", "kl", "entropy", "logprob_parity")}
    assert monitored | {"perf/generate_seconds_per_step", "perf/train_seconds_per_step"} <= set(online)
    # held-out gold reward before the first iteration (0) and every heldout_every=2 iterations
    heldout = (path / "metrics/online_dpo/plots/metrics/train/heldout/gold_reward.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in heldout[1:]] == ["0", "2", "4"]


def test_the_reported_preference_accuracy_is_the_dpo_models_implicit_reward_order_against_the_judge(o2o):
    path = o2o["path"]
    model = AutoModelForCausalLM.from_pretrained(path / "artifacts/dpo").eval()
    tokenizer = load_tokenizer(path / "artifacts/dpo")
    pairs = read_preferences(path / "artifacts/preferences/test.jsonl")
    reference = load_file(path / "artifacts/dpo_reference/logprobs.safetensors")
    tokenized = tokenize_pairs(pairs, tokenizer, BARE, "test.jsonl", 128)
    with torch.no_grad():
        scored = pair_logprobs(
            model, pack_pairs(tokenized, tokenizer.pad_token_id), (reference["test.chosen"], reference["test.rejected"])
        )
        _, chosen, rejected = preference_loss("dpo", scored, beta=0.1)
    expected = preference_metrics(chosen, rejected, pairs)["accuracy"]
    assert report_json(path)["dpo"]["preference_accuracy"] == pytest.approx(expected, abs=1e-5)


def test_dpo_killed_mid_run_resumes_to_identical_weights(o2o):
    output = resume_after_kill("dpo", o2o["path"])
    # The kill lands at the first checkpoint (step 4), or on a loaded machine at the next (the tiny steps are fast):
    # either is mid-run, so the rerun resumes rather than starts again.
    resumed = re.search(r"dpo: resuming from the checkpoint at step (\d+)", output)
    assert resumed and int(resumed.group(1)) in (4, 8), output[-3000:]
    assert (o2o["path"] / "artifacts/dpo/model.safetensors").read_bytes() == o2o["weights"]


def test_changing_beta_reruns_the_optimisation_and_not_the_reference_pass(o2o):
    path = o2o["path"]
    params = (path / "params.yaml").read_text()
    (path / "params.yaml").write_text(params.replace("  beta: 0.1\n", "  beta: 0.2\n", 1))  # dpo's, the first
    status = dvc(path, "status", "dpo", "dpo_reference")
    assert status.startswith("dpo:\n") and "dpo_reference:" not in status
    assert stages_run(repro(path, "offline_to_online")) == {"dpo", "eval@dpo", "online_dpo", "eval@online_dpo"}


def test_the_online_stage_can_run_grpo_from_the_dpo_checkpoint_instead(o2o):
    stage_output(o2o["path"], "online_dpo", "online_dpo.update=policy_gradient")
    train = json.loads((o2o["path"] / "metrics/online_dpo/metrics.json").read_text())["train"]
    assert "policy_loss" in train and "preference_loss" not in train


def stage_output(path, stage: str, *overrides: str) -> str:
    result = subprocess.run(
        ["alignflow", "stage", stage, *overrides], cwd=path, env=warm(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def test_dpo_on_the_pairs_the_verifier_separates_trains_as_on_a_file_of_those_pairs_alone(o2o):
    path = o2o["path"]

    def answering(example, answer: str) -> str:
        return re.sub(r"<answer>.*</answer>", f"<answer>{answer}</answer>", example.solution)

    separated, mixed = [], []
    for index, example in enumerate(read_examples(path / "artifacts/data/train.jsonl")[:8]):
        wrong = answering(example, example.answer + "9")
        # the label prefers the wrong answer in every other separated pair: the verifier keeps the pair, not a side
        chosen, rejected = (example.solution, wrong) if index % 2 else (wrong, example.solution)
        separated.append({"prompt": example.prompt, "chosen": chosen, "rejected": rejected})
        both_wrong = {"prompt": example.prompt, "chosen": answering(example, example.answer + "99"), "rejected": wrong}
        mixed += [both_wrong, separated[-1]]
    (path / "data").mkdir(exist_ok=True)
    shutil.copy(path / "artifacts/preferences/test.jsonl", path / "data/test_pairs.jsonl")
    weights, printed = {}, {}
    for name, rows, choice in (("mixed", mixed, "verifier_separated"), ("separated", separated, "all")):
        (path / f"data/{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        files = [f"preferences.train_file=data/{name}.jsonl", "preferences.test_file=data/test_pairs.jsonl"]
        stage_output(path, "preferences", *files)
        stage_output(path, "dpo_reference")
        printed[name] = stage_output(path, "dpo", f"dpo.pairs={choice}", "dpo.batch_size=4", "dpo.max_steps=3")
        weights[name] = load_file(path / "artifacts/dpo/model.safetensors")
    assert "dpo: 8 of 16 training pairs separated by the verifier" in printed["mixed"]
    for tensor, value in weights["mixed"].items():
        torch.testing.assert_close(value, weights["separated"][tensor], rtol=0, atol=1e-6)
    start = load_file(path / "artifacts/sft_cold/model.safetensors")
    assert any(not torch.equal(value, start[name]) for name, value in weights["separated"].items())


def test_the_stored_reference_is_the_same_bytes_in_every_process(tmp_path):
    """safetensors writes several metadata entries in its hash map's order, which differs between processes."""
    import hashlib
    import subprocess
    import sys

    write = (
        "import sys, torch; from pathlib import Path; from tasks.stages.dpo import save_reference; "
        "save_reference(Path(sys.argv[1]), {'train.chosen': torch.zeros(3)}, 'sft_cold', "
        "{'train': 'a' * 64, 'test': 'b' * 64})"
    )
    digests = set()
    for run in range(4):
        path = tmp_path / f"{run}.safetensors"
        subprocess.run([sys.executable, "-c", write, str(path)], check=True)
        digests.add(hashlib.md5(path.read_bytes()).hexdigest())
    assert len(digests) == 1
