"""The reward role of an RL stage, and best-of-n's scorer: the frozen reward model's members (and its judge)
scoring sampled responses (``tasks/rl/placement.py`` places it, ``tasks/rl/role_handles.py`` calls it;
``tasks/rl/reward_kinds.py`` holds the kinds)."""

import functools
from pathlib import Path

import torch

from models import load_tokenizer, resolve_device, vocabulary_mismatch
from models.trainable import compute_dtype
from tasks.algos.reward_models import REWARD_ENSEMBLES
from tasks.common.artifacts import judge_dir
from tasks.common.config import Params, RLConfig
from tasks.data.prompts import PromptFormat
from tasks.rl.reward_kinds import RewardModel
from tasks.rollout.engine import Completion


class RewardWorker:
    """The reward model (an ensemble's members, combined by ``reward_ensemble``) scoring sampled responses, each
    member by its kind's rule (``tasks/rl/reward_kinds.py``), and its judge (when it has one) scoring the guard's
    probes. A member that reads the policy's vocabulary scores exactly the token ids the engine read and sampled
    (with a BPE tokenizer, decoding and re-encoding them need not give them back); one with a vocabulary of its own
    (a reward backbone's) reads the text."""

    def __init__(self, params: Params, cfg: RLConfig, member_dirs: list[Path], policy_dir: Path):
        device, policy_tokenizer = resolve_device(params.device), load_tokenizer(policy_dir)

        def load(path: Path) -> tuple[RewardModel, bool]:
            member = RewardModel(path, device, dtype=compute_dtype(cfg.precision))
            return member, vocabulary_mismatch(member.tokenizer, policy_tokenizer) is None

        self.members = [load(path) for path in member_dirs]
        judge = judge_dir(member_dirs[0].parent) if member_dirs else None
        self.judge = load(judge) if judge is not None else None
        self.combine = functools.partial(REWARD_ENSEMBLES[cfg.reward_ensemble], std_coef=cfg.reward_ensemble_std_coef)
        self.std_coef = cfg.reward_ensemble_std_coef
        self.batch_size, self.prompt_format = params.eval.batch_size, PromptFormat.of(params.task)

    def _scores(self, scorer: tuple[RewardModel, bool], prompts: list[str], completions: list[Completion]):
        """(N,) one model's score of each completion, as a finished response (a truncated one ends with
        end-of-sequence here)."""
        member, same_ids = scorer
        if not same_ids:
            texts = [c.text for c in completions]
            return member.score_texts(self.prompt_format, prompts, texts, self.batch_size)
        eos = member.tokenizer.eos_token_id
        finished = [c.token_ids + [eos] * c.truncated for c in completions]
        return member.score_ids([c.prompt_ids for c in completions], finished, self.batch_size)

    def members_scores(self, prompts: list[str], completions: list[Completion]) -> torch.Tensor:
        """(M, N): each member's score of each completion."""
        return torch.stack([self._scores(member, prompts, completions) for member in self.members])

    def score(self, prompts: list[str], completions: list[Completion]) -> torch.Tensor:
        """Each completion's score, the members' combined by ``reward_ensemble``."""
        return self.combine(self.members_scores(prompts, completions))

    def judge_scores(self, prompts: list[str], completions: list[Completion]) -> dict[str, torch.Tensor]:
        """What the guard reads of ``completions``, (N,) each: the judge's scores (when there is a judge), the
        members' spread (std) and their conservative score (the mean_minus_std ensemble rule)."""
        scores = self.members_scores(prompts, completions)
        judged = {
            "disagreement": scores.std(0, correction=0),
            "ensemble": REWARD_ENSEMBLES["mean_minus_std"](scores, self.std_coef),
        }
        if self.judge is not None:
            judged["judge"] = self._scores(self.judge, prompts, completions)
        return judged

    def weights(self) -> dict[str, torch.Tensor]:
        members = enumerate(member for member, _ in self.members)
        return {f"{index}.{name}": tensor for index, member in members for name, tensor in member.weights().items()}
