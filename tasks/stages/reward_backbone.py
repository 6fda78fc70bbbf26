"""Stage `reward_backbone`: a model for the reward model to be fine-tuned from, sized apart from the policy.

A tiny Llama of ``reward_backbone``'s size, built from the seed, then fine-tuned on the training split's
worked solutions exactly as ``sft`` is (``tasks/stages/sft.py``, its checkpoints and guards included): a
backbone that has learnt the task before it learns to judge it. ``reward_model.backbone: reward_backbone``
picks it.
"""

import tempfile
from pathlib import Path

from models import build_char_tokenizer, build_tiny_llama
from tasks.common.registry import StageRun
from tasks.stages.sft import train


def run(stage: StageRun) -> None:
    params, cfg = stage.params, stage.config
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(cfg, tokenizer, params.seed)
    # The untrained model is an intermediate, not an artifact: it follows from the params and the seed.
    with tempfile.TemporaryDirectory(prefix="reward_backbone-init-") as init_dir:
        model.save_pretrained(init_dir)
        tokenizer.save_pretrained(init_dir)
        train(params, cfg, stage.name, Path(init_dir), stage.inputs["data"] / "train.jsonl")
