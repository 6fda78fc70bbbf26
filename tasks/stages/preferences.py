"""Stage `preferences`: (prompt, chosen, rejected) pairs sampled from ``preferences.policy`` and judged.

For each prompt, K responses are sampled; every pair of them whose gold utilities
differ is labelled by a noisy annotator (``tasks/data/judge.py``), as InstructGPT's
labellers ranked K responses. Training pairs come from training prompts, held-out
pairs from held-out prompts. Each row keeps the judge's utilities in ``meta``, so
a reward model can be scored against the noise-free order. Files of your own
(``preferences.train_file`` / ``test_file``) replace the sampled pairs, validated row by row.
"""

import itertools
import random

from tasks.common.artifacts import PREFERENCES_DIR, atomic_output
from tasks.common.config import PreferencesConfig
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live
from tasks.common.training import make_deterministic
from tasks.data.datasets import PreferencePair, read_examples, read_preferences, write_jsonl
from tasks.data.judge import gold_utility, prefers_first
from tasks.data.problems import Example
from tasks.rollout.engine import RolloutEngine, Sampling
from tasks.rollout.hf_engine import policy_engine


def judged_pairs(
    engine: RolloutEngine, examples: list[Example], cfg: PreferencesConfig, rng: random.Random
) -> list[PreferencePair]:
    sampling = Sampling(cfg.max_new_tokens, n=cfg.samples_per_prompt, temperature=cfg.temperature)
    completions = engine.generate([e.prompt for e in examples], sampling)
    pairs = []
    for index, example in enumerate(examples):
        group = completions[index * cfg.samples_per_prompt : (index + 1) * cfg.samples_per_prompt]
        scored = [(c.text, gold_utility(example, c.text, c.env_reward)) for c in group]
        for (text_a, utility_a), (text_b, utility_b) in itertools.combinations(scored, 2):
            if utility_a == utility_b or not text_a.strip() or not text_b.strip():
                continue  # the judge has no preference, or a response is empty
            first = prefers_first(utility_a, utility_b, cfg.judge.label_noise, rng)
            (chosen, u_chosen), (rejected, u_rejected) = (
                ((text_a, utility_a), (text_b, utility_b)) if first else ((text_b, utility_b), (text_a, utility_a))
            )
            meta = {"task": example.task, "gold_chosen": round(u_chosen, 6), "gold_rejected": round(u_rejected, 6)}
            pairs.append(PreferencePair(example.prompt, chosen, rejected, meta))
    return pairs


def label_agreement(pairs: list[PreferencePair]) -> float:
    verdicts = [pair.gold_prefers_chosen for pair in pairs if pair.gold_prefers_chosen is not None]
    return sum(verdicts) / len(verdicts) if verdicts else float("nan")


def run(stage: StageRun) -> None:
    params, cfg, data = stage.params, stage.config, stage.inputs["data"]
    # Files of your own are validated before any sampling starts.
    supplied = {
        split: read_preferences(path)
        for split, path in (("train", cfg.train_file), ("test", cfg.test_file))
        if path is not None
    }
    make_deterministic(params.seed)
    rng = random.Random(f"alignflow-preferences-{params.seed}")
    prompts = {
        "train": read_examples(data / "train.jsonl")[: cfg.num_prompts],
        "test": read_examples(data / "test.jsonl"),
    }
    to_sample = [split for split in ("train", "test") if split not in supplied]
    splits = dict(supplied)
    if to_sample:
        policy = stage.inputs["policy"]
        checked = {data / f"{split}.jsonl": prompts[split] for split in to_sample}
        engine = policy_engine(params, policy, checked, "preferences")
        for split in to_sample:
            splits[split] = judged_pairs(engine, prompts[split], cfg, rng)

    with atomic_output(PREFERENCES_DIR) as out, stage_live("preferences") as live:
        out.mkdir()
        for split, pairs in splits.items():
            write_jsonl(out / f"{split}.jsonl", pairs)
            live.log_metric(f"{split}/pairs", len(pairs), plot=False)
            live.log_metric(f"{split}/label_agreement", round(label_agreement(pairs), 6), plot=False)
    print(
        "preferences: "
        + ", ".join(
            f"{split} {len(pairs)} pairs (agree {label_agreement(pairs):.3f})" for split, pairs in splits.items()
        ),
        flush=True,
    )
