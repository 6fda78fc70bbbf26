"""Reward-model kinds: how a reward model scores a response, and what it learns from preference pairs.

One interface serves every consumer (PPO's reward role, best_of_n, rejection sampling, any RL stage's ``rewards``):
``RewardModel.score`` gives one float per (prompt, response). A kind is a score function registered here by name
(``reward_model.kind``), with the metadata the code around it reads instead of the name:

- ``classifier``: a scalar head on the last token's hidden state: the Bradley–Terry reward model (InstructGPT).
- ``grm``: the same head, trained with the chosen responses' language-modelling loss read through the backbone's own
  LM head, kept frozen beside it, so the hidden states the head reads still predict text (Yang et al., 2024,
  "Regularizing Hidden States Enables Learning Generalizable Reward Model for LLMs").
- ``generative``: log p(verdict token | prompt, response, verification question) under the causal LM, trained on
  the pairs with the LM loss on chosen responses (Zhang et al., 2024, "Generative Verifiers").
- ``likelihood``: the backbone's own mean token log-prob of the response, untrained (Huang et al., 2024): the
  baseline every learned kind must beat, as it is what the backbone knows before it learns to judge.
- ``implicit``: β·log π(y|x)/π_ref(y|x) of a model trained against a reference (DPO's implicit reward).

Every trained kind minimises the Bradley–Terry loss on its score of chosen against rejected (for the score
β·log π/π_ref that is DPO's loss) plus ``lm_coef`` × the chosen responses' mean token NLL where it reads an LM head.
Members are Hugging Face directories (a sequence classifier for classifier and grm, a causal LM otherwise);
``scoring.json`` beside them holds the rule that turns one into scores (and ``reference/`` the implicit kind's
reference). Shapes: B rows, T response positions (the response, its end-of-sequence, then any verification suffix).
"""

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from models import load_reference, load_reward_model, load_tokenizer
from tasks.algos.tokens import masked, token_logprobs
from tasks.common.registry_type import Registry
from tasks.data.prompts import PromptFormat
from tasks.rl.sequences import PackedBatch, pack, response_logprobs

if TYPE_CHECKING:
    from tasks.common.config import Params

SCORING_FILE, REFERENCE_DIR = "scoring.json", "reference"


@dataclass(frozen=True)
class Scoring:
    """A reward model's scoring rule, saved as ``scoring.json`` beside its members."""

    kind: str
    verdict_suffix: str = ""  # generative: the verification question asked after the finished response
    verdict_token: str = ""  # generative: the answer whose log-prob is the score
    beta: float = 1.0  # implicit: the scale of log π/π_ref, the β its model was trained with

    def save(self, root: Path) -> None:
        (root / SCORING_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, root: Path) -> "Scoring":
        path = root / SCORING_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no scoring rule; a reward model from before reward kinds: re-run it")
        return cls(**json.loads(path.read_text()))

    def extra_ids(self, tokenizer: PreTrainedTokenizerBase) -> list[int]:
        """What follows each finished response before scoring: the suffix and the verdict token (whose log-prob the
        last position then holds), or nothing."""
        if not self.verdict_token:
            return []
        return tokenizer(self.verdict_suffix, add_special_tokens=False)["input_ids"] + [verdict_id(tokenizer, self)]


def verdict_id(tokenizer: PreTrainedTokenizerBase, scoring: Scoring) -> int:
    """The verdict token's id; ValueError when the tokenizer does not encode it as exactly one token."""
    ids = tokenizer(scoring.verdict_token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(
            f"reward_model.verdict_token: {scoring.verdict_token!r} is {len(ids)} tokens for this tokenizer, not one"
        )
    return ids[0]


@dataclass
class RewardOutput:
    scores: torch.Tensor  # (B,) float32
    lm_logprobs: torch.Tensor | None  # (B, T) log-probs of the response tokens under an LM head, for the LM loss


@dataclass
class Frozen:
    """What a kind reads beside its model: the implicit kind's reference, grm's LM head (training only)."""

    scoring: Scoring
    reference: PreTrainedModel | None = None
    lm_head: torch.Tensor | None = None  # (V, H)


ScoreFunction = Callable[[PreTrainedModel, PackedBatch, torch.Tensor, Frozen], RewardOutput]
# head: the member's model class ("classifier": a sequence classifier, "lm": a causal LM); trains: learns from the
# pairs (else the stage saves its backbone as it is); lm_loss: lm_coef applies; needs_reference: reads a reference
# (the backbone must be a model trained against one); suffix: asks the verification question.
REWARD_KINDS: Registry[ScoreFunction] = Registry(
    "reward-model kind", head="lm", trains=True, lm_loss=False, needs_reference=False, suffix=False
)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) the column of each row's last real token (rows are right-padded)."""
    width = attention_mask.shape[1]
    return width - 1 - attention_mask.flip(-1).argmax(-1)


def _scalar_head(model: PreTrainedModel, batch: PackedBatch, mask: torch.Tensor, frozen: Frozen) -> RewardOutput:
    hidden = model.get_decoder()(**batch.model_inputs()).last_hidden_state  # (B, P + T, H)
    rows = torch.arange(len(hidden), device=hidden.device)
    scores = model.score(hidden[rows, last_token_index(batch.attention_mask)]).squeeze(-1).float()
    if frozen.lm_head is None:
        return RewardOutput(scores, None)
    logits = batch.response_logits(hidden) @ frozen.lm_head.to(hidden.dtype).T  # (B, T, V)
    return RewardOutput(scores, token_logprobs(logits, batch.response_ids))


REWARD_KINDS.register("classifier", head="classifier")(_scalar_head)
REWARD_KINDS.register("grm", head="classifier", lm_loss=True)(_scalar_head)


@REWARD_KINDS.register("generative", lm_loss=True, suffix=True)
def generative(model: PreTrainedModel, batch: PackedBatch, mask: torch.Tensor, frozen: Frozen) -> RewardOutput:
    """log p(verdict | …): the verdict token is the row's last, so its log-prob sits at the row's last position."""
    logprobs = response_logprobs(model, batch, 1.0)
    last = batch.response_mask.sum(-1).long() - 1
    return RewardOutput(logprobs.gather(1, last[:, None]).squeeze(1), logprobs)


@REWARD_KINDS.register("likelihood", trains=False)
def likelihood(model: PreTrainedModel, batch: PackedBatch, mask: torch.Tensor, frozen: Frozen) -> RewardOutput:
    """The mean token log-prob of the response and its end-of-sequence."""
    logprobs = response_logprobs(model, batch, 1.0)
    return RewardOutput(masked(logprobs, mask).sum(-1) / mask.sum(-1).clamp(min=1), logprobs)


@REWARD_KINDS.register("simpo", lm_loss=True)
def simpo(model: PreTrainedModel, batch: PackedBatch, mask: torch.Tensor, frozen: Frozen) -> RewardOutput:
    """The likelihood kind's score, trained: β·mean token log-prob of the response, SimPO's reference-free
    implicit reward (Meng et al., 2024), here the score of a reward model rather than the policy's objective. It
    starts where the untrained backbone ranks and learns from the pairs how far to move."""
    out = likelihood(model, batch, mask, frozen)
    return RewardOutput(frozen.scoring.beta * out.scores, out.lm_logprobs)


@REWARD_KINDS.register("implicit", trains=False, needs_reference=True)
def implicit(model: PreTrainedModel, batch: PackedBatch, mask: torch.Tensor, frozen: Frozen) -> RewardOutput:
    """β·(log π(y|x) − log π_ref(y|x)), summed over the response's tokens."""
    logprobs = response_logprobs(model, batch, 1.0)
    with torch.no_grad():
        reference = response_logprobs(frozen.reference, batch, 1.0)
    return RewardOutput(frozen.scoring.beta * masked(logprobs - reference, mask).sum(-1), logprobs)


def pack_scored(
    tokenizer: PreTrainedTokenizerBase, scoring: Scoring, prompt_ids: list[list[int]], finished: list[list[int]]
) -> tuple[PackedBatch, torch.Tensor]:
    """(the rows as the kind reads them, (B, T) mask of each finished response's own tokens): each finished response
    followed by the kind's verification suffix and verdict token, if it asks one."""
    extra = scoring.extra_ids(tokenizer)
    batch = pack(prompt_ids, [ids + extra for ids in finished], tokenizer.pad_token_id)
    lengths = torch.tensor([len(ids) for ids in finished])
    return batch, (torch.arange(batch.response_mask.shape[1]) < lengths[:, None]).float()


class RewardModel:
    """One member of a reward model, frozen, as its consumers score with it; ``scoring`` in place of the rule saved
    beside it reads any model by an untrained kind's rule (a policy's own likelihood)."""

    def __init__(
        self, member: Path, device: torch.device, dtype: torch.dtype = torch.float32, scoring: Scoring | None = None
    ):
        self.scoring, self.tokenizer = scoring or Scoring.load(member.parent), load_tokenizer(member)
        entry = REWARD_KINDS[self.scoring.kind]
        load = load_reward_model if entry.head == "classifier" else load_reference  # both load frozen
        self.model = load(member, device, dtype=dtype)
        reference = load_reference(member.parent / REFERENCE_DIR, device, dtype) if entry.needs_reference else None
        self.frozen, self.function = Frozen(self.scoring, reference), entry.function

    @torch.no_grad()
    def score_ids(self, prompt_ids: list[list[int]], finished: list[list[int]], batch_size: int) -> torch.Tensor:
        """(N,) the score of each (prompt ids, finished response ids), in this member's vocabulary."""
        scores = []
        for start in range(0, len(prompt_ids), batch_size):
            rows = slice(start, start + batch_size)
            batch, mask = pack_scored(self.tokenizer, self.scoring, prompt_ids[rows], finished[rows])
            device = self.model.device
            scores.append(self.function(self.model, batch.to(device), mask.to(device), self.frozen).scores.cpu())
        return torch.cat(scores)

    def score_texts(
        self, prompt_format: PromptFormat, prompts: list[str], responses: list[str], batch_size: int
    ) -> torch.Tensor:
        """(N,) the score of each (prompt, response) text, as a finished response."""
        finished = [prompt_format.response_ids(self.tokenizer, r) for r in responses]
        return self.score_ids(prompt_format.encode(self.tokenizer, prompts), finished, batch_size)

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: tensor.cpu() for name, tensor in self.model.state_dict().items()}


def implicit_reference(params: "Params", backbone: str) -> tuple[str, float] | None:
    """(the reference model, β) of ``backbone`` when a preference loss trained it against a reference (dpo, or
    online_dpo's preference update): what the implicit kind's β·log π/π_ref reads; else None."""
    from tasks.common.config import Params
    from tasks.common.config.fields import schema_fields
    from tasks.common.config.sections import PreferenceLossConfig
    from tasks.kinds import stage_kinds
    from tasks.rl.preference_losses import PREFERENCE_LOSSES

    kind = stage_kinds().get(backbone.partition("/")[0])
    # the section's type first: a backbone trained otherwise (sft) is not read at all
    section_type = schema_fields(Params)[kind.section].annotation if kind is not None else None
    if not (isinstance(section_type, type) and issubclass(section_type, PreferenceLossConfig)):
        return None
    cfg = getattr(params, kind.section)
    if getattr(cfg, "update", "preference") != "preference":
        return None
    loss = PREFERENCE_LOSSES.get(cfg.preference_loss)
    return (cfg.init, cfg.beta) if loss is not None and loss.needs_reference else None
