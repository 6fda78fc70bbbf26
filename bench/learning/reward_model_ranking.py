"""How often a reward model scores a right answer above a wrong one to the same held-out problem: the ranking a
group-relative RL stage reads, measured on the greedy answers every evaluated model of a project gave.

For each held-out prompt the distinct formatted answers of ``artifacts/eval/*/greedy.jsonl`` (and the rounds'
``eval/<stage>/<round>/``) are split by the verifier into right and wrong; every (right, wrong) pair of the same
prompt counts 1 when the scorer puts the right one above, 1/2 on a tie. Beside the project's reward model (each
member, by its own kind's rule) it scores the untrained baselines: each ``--likelihood`` model's own mean token
log-prob, which is what the ``simpo`` and ``likelihood`` kinds start from.

    .venv/bin/python -m bench.learning.reward_model_ranking --project <a clone where rlhf or r1 ran> \\
        --likelihood sft sft_cold
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from models import load_reference, load_tokenizer
from tasks.data.prompts import PromptFormat
from tasks.params.load import load_params
from tasks.rl.reward_kinds import REWARD_KINDS, Frozen, RewardModel, Scoring, pack_scored


def answers_by_prompt(project: Path) -> dict[str, dict[str, bool]]:
    """{prompt: {formatted answer: right}} over every greedy evaluation in ``project``."""
    answers: dict[str, dict[str, bool]] = defaultdict(dict)
    for path in sorted((project / "artifacts" / "eval").rglob("greedy.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["formatted"]:
                answers[row["prompt"]][row["response"]] = bool(row["correct"])
    return answers


def ranking(scores: dict[tuple[str, str], float], answers: dict[str, dict[str, bool]]) -> tuple[float, int]:
    """(the share of same-prompt (right, wrong) pairs the scores order right first, ties counting half; pairs)."""
    won, pairs = 0.0, 0
    for prompt, verdicts in answers.items():
        right = [scores[prompt, a] for a, ok in verdicts.items() if ok]
        wrong = [scores[prompt, a] for a, ok in verdicts.items() if not ok]
        for r in right:
            for w in wrong:
                won += 1.0 if r > w else 0.5 if r == w else 0.0
                pairs += 1
    return won / max(pairs, 1), pairs


def likelihood_scorer(model_dir: Path, prompt_format: PromptFormat, batch_size: int):
    """The untrained likelihood kind on ``model_dir``: its mean token log-prob of each response."""
    model, tokenizer = load_reference(model_dir, torch.device("cpu")), load_tokenizer(model_dir)
    scoring, score = Scoring(kind="likelihood"), REWARD_KINDS["likelihood"].function

    @torch.no_grad()
    def scorer(prompts: list[str], responses: list[str]) -> torch.Tensor:
        prompt_ids = prompt_format.encode(tokenizer, prompts)
        finished = [prompt_format.response_ids(tokenizer, r) for r in responses]
        out = []
        for start in range(0, len(prompts), batch_size):
            rows = slice(start, start + batch_size)
            batch, mask = pack_scored(tokenizer, scoring, prompt_ids[rows], finished[rows])
            out.append(score(model, batch, mask, Frozen(scoring)).scores)
        return torch.cat(out)

    return scorer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=Path.cwd())
    parser.add_argument("--reward-model", default="reward_model", help="the reward model's directory in artifacts/")
    parser.add_argument("--likelihood", nargs="*", default=[], help="models in artifacts/ scored by their log-prob")
    args = parser.parse_args()
    params = load_params(args.project / "params.yaml")
    prompt_format, batch_size = PromptFormat.of(params.task), params.eval.batch_size
    answers = answers_by_prompt(args.project)
    keys = [(prompt, answer) for prompt, verdicts in answers.items() for answer in verdicts]
    prompts, responses = [k[0] for k in keys], [k[1] for k in keys]
    right = sum(ok for verdicts in answers.values() for ok in verdicts.values())
    print(f"{len(keys)} distinct formatted answers to {len(answers)} prompts ({right} right)", flush=True)

    scorers = {}
    for member in sorted((args.project / "artifacts" / args.reward_model).glob("member-*")):
        model = RewardModel(member, torch.device("cpu"))
        name = f"{args.reward_model}/{member.name} ({model.scoring.kind})"
        scorers[name] = lambda p, r, model=model: model.score_texts(prompt_format, p, r, batch_size)
    for name in args.likelihood:
        model_dir = args.project / "artifacts" / name
        scorers[f"likelihood of {name}"] = likelihood_scorer(model_dir, prompt_format, batch_size)
    for name, scorer in scorers.items():
        scores = dict(zip(keys, scorer(prompts, responses).tolist(), strict=True))
        share, pairs = ranking(scores, answers)
        print(f"{name:<40} right above wrong {share:.3f} of {pairs} same-prompt pairs", flush=True)


if __name__ == "__main__":
    main()
