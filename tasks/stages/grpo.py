"""The GRPO stages of the R1 recipe; the loop is ``tasks/rl/trainer.py``, the algorithm is what their params name.

- ``grpo``: reasoning RL with rule-based rewards, from the cold-start SFT model (``params.grpo``);
- ``grpo_zero``: R1-Zero, the same RL straight from the base model (``params.grpo``);
- ``grpo_final@<round>``: the final RL stage of a round, from that round's SFT model, with mixed
  rewards: the rule-based ones and the RLHF reward model (``params.grpo_final``).
"""

from tasks.common.artifacts import DATA_DIR, member_dirs, upstream_model
from tasks.common.config import Params
from tasks.rl import trainer as rl


def run(params: Params) -> None:
    rl.train(params, params.grpo, "grpo", upstream_model("sft_cold"), DATA_DIR / "train.jsonl", [])


def run_zero(params: Params) -> None:
    rl.train(params, params.grpo, "grpo_zero", upstream_model("base"), DATA_DIR / "train.jsonl", [])


def run_final(params: Params, round_name: str) -> None:
    init = upstream_model(f"sft_rs@{round_name}")
    rl.train(params, params.grpo_final, f"grpo_final@{round_name}", init, DATA_DIR / "train.jsonl", member_dirs())
