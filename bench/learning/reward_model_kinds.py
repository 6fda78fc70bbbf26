"""Reward-model kinds side by side: held-out accuracy (default label noise and noise-free), best-of-16 gold gain
and train time, each kind from the default backbone (sft) on the same preference pairs sampled from PPO's start.

Everything runs through the real stages in a scratch clone with the default params but for the kind:

    python -m bench.learning.reward_model_kinds                        # the table in docs/rlhf.md
    python -m bench.learning.reward_model_kinds --kinds simpo likelihood
    python -m bench.learning.reward_model_kinds --project /tmp/r1   # reuse a project where `alignflow repro r1` ran

``likelihood`` is measured twice: from the default backbone (sft's own log-prob) and from the policy whose samples
best-of-n ranks (sft_cold's: the policy's own, Huang et al.'s sharpening). ``implicit`` reads the dpo stage's model
against its reference, so its train time is dpo's (and its noise-free accuracy is not measured: its dpo model
would train again). Best-of-16 keeps each kind's favourite of the same 16 samples per
held-out prompt; the gain is over a random pick, the share is of the oracle's gain.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.harness import cold_start_project, stage

# What each row runs (beside the default params): the classifier-type kinds learn a head or a verdict from scratch
# and take the learning rate the Bradley-Terry classifier was tuned at; the likelihood-based ones start from what the
# backbone knows and keep the default.
KINDS = {
    "simpo": ["reward_model.kind=simpo"],
    "classifier": ["reward_model.kind=classifier", "reward_model.lr=3e-4"],
    "grm": ["reward_model.kind=grm", "reward_model.lr=3e-4"],
    "generative": ["reward_model.kind=generative", "reward_model.lr=3e-4"],
    "likelihood": ["reward_model.kind=likelihood"],
    "likelihood (policy's own)": ["reward_model.kind=likelihood", "reward_model.backbone=sft_cold"],
    "implicit": ["reward_model.kind=implicit", "reward_model.backbone=dpo"],
}
NOISE_FREE = ["preferences.judge.label_noise=0"]
# 16 samples per held-out prompt, the same for every kind (the seed fixes them): each kind's best of the same 16.
BEST_OF_16 = ["best_of_n.n=16", "best_of_n.max_n=16"]


def timed(project: Path, *args: str) -> float:
    started = time.perf_counter()
    stage(project, *args)
    return time.perf_counter() - started


def metrics(project: Path, name: str) -> dict:
    return json.loads((project / "metrics" / name / "metrics.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument(
        "--project", type=Path, help="a project whose data, sft_cold, sft and preferences (default params) are built"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        project = args.project
        if project is None:
            project = cold_start_project(Path(scratch) / "project")
            for name in ("sft", "preferences"):
                stage(project, name)
        columns = ("accuracy", "noise-free", "bo16 gold", "gain", "share", "train s")
        header = f"{'kind':<26} " + " ".join(f"{column:>10}" for column in columns)
        rows = {}
        for kind in args.kinds:
            # the implicit kind reads the dpo stage's model: its training is the kind's
            seconds = sum(timed(project, name) for name in ("dpo_reference", "dpo")) if kind == "implicit" else 0.0
            seconds += timed(project, "reward_model", *KINDS[kind])
            accuracy = metrics(project, "reward_model")["accuracy"]
            stage(project, "best_of_n", *KINDS[kind], *BEST_OF_16)
            best_of_n = metrics(project, "best_of_n")
            rows[kind] = [accuracy, best_of_n["gold_reward@bon16"], best_of_n["bon_gain@16"]]
            rows[kind] += [best_of_n["bon_recovered@16"], seconds]
            print(f"  {kind}: {rows[kind]} (noise-free accuracy follows)", flush=True)
        stage(project, "preferences", *NOISE_FREE)
        print(header, flush=True)
        for kind in args.kinds:
            accuracy, gold, gain, share, seconds = rows[kind]
            clean = float("nan")  # the implicit kind's dpo model would train again on the clean labels: 10 min here
            if kind != "implicit":
                stage(project, "reward_model", *KINDS[kind], *NOISE_FREE)
                clean = metrics(project, "reward_model")["accuracy"]
            numbers = [f"{v:.3f}" for v in (accuracy, clean, gold, gain)] + [f"{share:.2f}", f"{seconds:.0f}"]
            print(f"{kind:<26} " + " ".join(f"{number:>10}" for number in numbers), flush=True)
        best_of_n = metrics(project, "best_of_n")
        print(f"random pick {best_of_n['gold_reward']:.3f}, oracle best-of-16 {best_of_n['gold_reward@oracle16']:.3f}")


if __name__ == "__main__":
    main()
