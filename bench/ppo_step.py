"""PPO iteration time split by phase (generate / score / train), per rollout backend, side by side.

Runs ``--steps`` PPO iterations on this project's ``artifacts/sft`` and ``artifacts/reward_model``
(run `alignflow repro rlhf`, or the stages up to `reward_model`, first) for each backend
available (hf always; vllm when installed), after one warm-up iteration, and prints the
mean seconds per phase, each phase's share, and backend ratios.

    .venv/bin/python bench/ppo_step.py [--steps N] [KEY=VALUE ...]   # optional param overrides
"""

import statistics
import sys
from importlib.util import find_spec

from models import load_tokenizer
from tasks.common.artifacts import DATA_DIR, member_dirs, model_dir
from tasks.common.config import ConfigError
from tasks.common.training import make_deterministic
from tasks.data.datasets import read_examples
from tasks.params.load import load_params
from tasks.rl.learner import LoopState
from tasks.rl.placement import place
from tasks.rl.policy_gradient import learn, needed_roles
from tasks.rl.rewards import RewardScorer
from tasks.rl.trainer import collect

PHASES = ("time/generate", "time/score", "time/train")


def measure(backend: str, steps: int, overrides: list[str]) -> dict[str, float]:
    params = load_params("params.yaml", [*overrides, f"ppo.rollout_backend={backend}"])
    make_deterministic(params.seed)
    cfg, examples, tokenizer = params.ppo, read_examples(DATA_DIR / "train.jsonl"), load_tokenizer(model_dir("sft"))
    roles = place(params, cfg, model_dir("sft"), member_dirs(), needed_roles(cfg))
    state, scorer = LoopState(kl_coef=cfg.kl_coef), RewardScorer(cfg.rewards, cfg.reward_timeout_seconds)
    samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for step in range(steps + 1):
        clock = dict.fromkeys(PHASES, 0.0)
        rollout, _ = collect(roles, scorer, examples, cfg, state, params.seed, clock)
        learn(roles, rollout, tokenizer, cfg, state, clock)
        if step > 0:  # the first iteration warms caches and the engine up
            for phase in PHASES:
                samples[phase].append(clock[phase])
    return {phase: statistics.mean(values) for phase, values in samples.items()}


def main(steps: int, overrides: list[str]) -> None:
    backends = ["hf"]
    if find_spec("vllm"):
        try:
            load_params("params.yaml", [*overrides, "ppo.rollout_backend=vllm"])
            backends.append("vllm")
        except ConfigError as error:
            print(f"vllm skipped: {error}")
    results = {backend: measure(backend, steps, overrides) for backend in backends}
    print(f"PPO iteration, mean of {steps} after one warm-up, seconds per phase")
    print(f"  {'backend':<8}" + "".join(f"{phase[5:]:>18}" for phase in PHASES) + f"{'total':>10}")
    for backend, phases in results.items():
        total = sum(phases.values())
        cells = "".join(f"{seconds:8.3f} ({seconds / total:4.0%})   " for seconds in phases.values())
        print(f"  {backend:<8}{cells}{total:8.3f}")
    if "vllm" in results:
        for phase in PHASES:
            print(f"  vllm / hf {phase[5:]:<9} {results['vllm'][phase] / results['hf'][phase]:.2f}x")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    steps = 5
    if arguments[:1] == ["--steps"]:
        steps, arguments = int(arguments[1]), arguments[2:]
    main(steps, arguments)
