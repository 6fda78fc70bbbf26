"""Nothing cut off without a word: responses that hit max_new_tokens are counted (eval's and the RL loop's
``truncated_rate``), and a stage whose max_new_tokens cannot hold the task's own worked solutions says so first."""

from dataclasses import replace

import pytest
import torch

from models.tokenizer import build_char_tokenizer
from tasks.common.config import Params
from tasks.data.datasets import generate_splits
from tasks.data.prompts import BARE
from tasks.rl.learner import Rollout
from tasks.rl.trainer import rollout_metrics
from tasks.rollout.engine import Completion, Sampling
from tasks.rollout.hf_engine import policy_engine
from tasks.stages.eval import evaluate
from tests.conftest import tiny_model

PARAMS = Params()
TRAIN, TEST = generate_splits(PARAMS.task, num_train=4, num_test=4, seed=0)


class CuttingEngine:
    """Answers every prompt with its worked solution, cut off (no stop token) for the prompts of ``cut``."""

    def __init__(self, examples, cut: set[int]):
        self.examples, self.cut = examples, cut
        self.tokenizer, self.prompt_format = build_char_tokenizer(), BARE
        self.stop_ids = [self.tokenizer.eos_token_id]

    def generate_ids(self, prompt_ids: list[list[int]], sampling: Sampling) -> list[Completion]:
        return [
            Completion(i, prompt_ids[i], [2], self.examples[i].solution, [0.0], truncated=i in self.cut)
            for i in range(len(prompt_ids))
            for _ in range(sampling.n)
        ]


def test_eval_reports_the_share_of_greedy_responses_cut_off():
    metrics, _ = evaluate(CuttingEngine(TEST, cut={1}), TEST, replace(PARAMS.eval, k=2), PARAMS.agent, 4096)
    assert metrics["truncated_rate"] == 0.25


def test_every_rl_iterations_rollout_metrics_count_the_responses_cut_off():
    completions = [Completion(i, [1], [2], e.solution, [0.0], truncated=i < 3) for i, e in enumerate(TRAIN)]
    rollout = Rollout(TRAIN, completions, torch.zeros(4), {}, {})
    assert rollout_metrics(rollout)["truncated_rate"] == 0.75


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny"))


def test_a_stage_whose_max_new_tokens_cannot_hold_the_worked_solutions_warns_naming_the_key(model_dir, capsys):
    """eval.max_new_tokens=20 took pass@1 from 1.000 to 0.270 and said nothing."""
    params = replace(PARAMS, device="cpu")
    policy_engine(
        replace(params, eval=replace(params.eval, max_new_tokens=20)), model_dir, {"test.jsonl": TEST}, "eval"
    )
    warning = capsys.readouterr().err
    assert "eval.max_new_tokens=20: 4 of the 4 worked solutions in test.jsonl (100%" in warning, warning
    assert "responses will be cut off" in warning

    policy_engine(params, model_dir, {"test.jsonl": TEST}, "eval")
    assert "max_new_tokens" not in capsys.readouterr().err
