"""How often a reward model scores a right answer above a wrong one to the same problem, both in the answer's
format: the ranking a group-relative RL stage reads when the format is learnt and only the sum is left to get right.

Two sets of such pairs from a project: the greedy answers every evaluated model gave
(``artifacts/eval/*/greedy.jsonl`` and the rounds' ``eval/<stage>/<round>/``: for each held-out problem every
distinct right answer against every distinct wrong one), and the held-out preference pairs
(``artifacts/preferences/test.jsonl``: samples to the held-out problems, which the reward model never trained on)
whose two responses the verifier marks one right, one wrong. A pair counts 1 when the scorer puts the right answer
above, 1/2 on a tie. Beside the project's reward model (each member, by its own kind's rule) it scores the untrained
baselines: each ``--likelihood`` model's own mean token log-prob, which is what the ``simpo`` and ``likelihood``
kinds start from.

    .venv/bin/python -m bench.learning.reward_model_ranking --project <a clone where rlhf or r1 ran> \\
        --likelihood sft sft_cold
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from tasks.data.datasets import read_examples, read_preferences
from tasks.data.problems import score_response
from tasks.data.prompts import PromptFormat
from tasks.params.load import load_params
from tasks.rl.reward_kinds import RewardModel, Scoring

Answer = tuple[str, str]  # (prompt, response)


def greedy_pairs(project: Path) -> list[tuple[Answer, Answer]]:
    """(right, wrong) formatted greedy answers to the same held-out problem, over every evaluation in ``project``."""
    answers: dict[str, dict[str, bool]] = defaultdict(dict)
    for path in sorted((project / "artifacts" / "eval").rglob("greedy.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["formatted"]:
                answers[row["prompt"]][row["response"]] = bool(row["correct"])
    return [
        ((prompt, right), (prompt, wrong))
        for prompt, verdicts in answers.items()
        for right, right_ok in verdicts.items()
        for wrong, wrong_ok in verdicts.items()
        if right_ok and not wrong_ok
    ]


def preference_pairs(project: Path) -> list[tuple[Answer, Answer]]:
    """(right, wrong) held-out preference pairs, both formatted, whatever their label says."""
    examples = {e.prompt: e for e in read_examples(project / "artifacts" / "data" / "test.jsonl")}
    pairs = []
    for pair in read_preferences(project / "artifacts" / "preferences" / "test.jsonl"):
        verdicts = {r: score_response(examples[pair.prompt], r) for r in (pair.chosen, pair.rejected)}
        if all(formatted for formatted, _ in verdicts.values()):
            right = [r for r, (_, correct) in verdicts.items() if correct]
            wrong = [r for r, (_, correct) in verdicts.items() if not correct]
            if right and wrong:
                pairs.append(((pair.prompt, right[0]), (pair.prompt, wrong[0])))
    return pairs


def ranking(scores: dict[Answer, float], pairs: list[tuple[Answer, Answer]]) -> float:
    """The share of (right, wrong) pairs the scores order right first, ties counting half."""
    won = sum(1.0 if scores[r] > scores[w] else 0.5 if scores[r] == scores[w] else 0.0 for r, w in pairs)
    return won / max(len(pairs), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=Path.cwd())
    parser.add_argument("--reward-model", default="reward_model", help="the reward model's directory in artifacts/")
    parser.add_argument("--likelihood", nargs="*", default=[], help="models in artifacts/ scored by their log-prob")
    args = parser.parse_args()
    params = load_params(args.project / "params.yaml")
    prompt_format, batch_size = PromptFormat.of(params.task), params.eval.batch_size
    sets = {"greedy answers": greedy_pairs(args.project), "held-out preference pairs": preference_pairs(args.project)}
    keys = sorted({answer for pairs in sets.values() for pair in pairs for answer in pair})
    prompts, responses = [k[0] for k in keys], [k[1] for k in keys]
    print(", ".join(f"{len(pairs)} (right, wrong) {name}" for name, pairs in sets.items()), flush=True)

    scorers = {}
    for member in sorted((args.project / "artifacts" / args.reward_model).glob("member-*")):
        model = RewardModel(member, torch.device("cpu"))
        name = f"{args.reward_model}/{member.name} ({model.scoring.kind})"
        scorers[name] = lambda p, r, model=model: model.score_texts(prompt_format, p, r, batch_size)
    for name in args.likelihood:
        model = RewardModel(args.project / "artifacts" / name, torch.device("cpu"), scoring=Scoring(kind="likelihood"))
        scorers[f"likelihood of {name}"] = lambda p, r, model=model: model.score_texts(prompt_format, p, r, batch_size)
    for name, scorer in scorers.items():
        scores = dict(zip(keys, scorer(prompts, responses).tolist(), strict=True))
        shares = ", ".join(f"{ranking(scores, pairs):.3f} of the {which}" for which, pairs in sets.items())
        print(f"{name:<40} right above wrong: {shares}", flush=True)


if __name__ == "__main__":
    main()
