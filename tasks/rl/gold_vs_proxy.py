"""Over-optimisation as Gao, Schulman and Hilton (2022) plot it: gold and proxy reward against √KL(π‖π_init).

Two curves, one file each (``gold_vs_proxy.tsv`` in a stage's metrics directory, a ``dvc plots`` plot with x
``sqrt_kl`` and y ``gold`` and ``proxy``): best-of-n (``best_of_n_curve``: KL = log n − (n − 1)/n, each n's
expectation over every n-subset of the samples) and an RL run (``rl_curve``: the KL to the reference measured at
each iteration, the rollouts' gold reward and the reward model's score). The peak gold reward and the √KL where it
falls are the numbers to read off them: past the peak, optimising the proxy harder costs gold reward.
"""

import math
from pathlib import Path

import torch

from tasks.algos.reward_models import best_of_n_expectation, best_of_n_kl
from tasks.common.artifacts import CURVE_FILE


def best_of_n_sizes(n: int, max_n: int) -> list[int]:
    """The n of the best-of-n curve: powers of two up to ``max_n``, with ``n`` and ``max_n`` themselves."""
    return sorted({2**k for k in range(int(math.log2(max_n)) + 1)} | {n, max_n})


def best_of_n_curve(proxy: torch.Tensor, gold: torch.Tensor, sizes: list[int]) -> list[dict[str, float]]:
    """One row per n (proxy, gold: (prompts, samples)): √KL, the kept response's expected gold reward and proxy
    score, and the oracle's expected gold (the judge keeping the best of n)."""
    return [
        {
            "n": n,
            "sqrt_kl": math.sqrt(best_of_n_kl(n)),
            "gold": best_of_n_expectation(proxy, gold, n).mean().item(),
            "proxy": best_of_n_expectation(proxy, proxy, n).mean().item(),
            "oracle": best_of_n_expectation(gold, gold, n).mean().item(),
        }
        for n in sizes
    ]


def rl_curve(history: list[tuple[int, dict[str, float]]], proxy: str) -> list[dict[str, float]]:
    """One row per iteration that trained: √KL to the reference, the rollouts' gold reward and ``proxy`` metric."""
    return [
        {"step": step, "sqrt_kl": math.sqrt(max(0.0, m["kl"])), "gold": m["gold_reward"], "proxy": m[proxy]}
        for step, m in history
        if {"kl", "gold_reward", proxy} <= m.keys()
    ]


def peak(rows: list[dict[str, float]]) -> dict[str, float]:
    """The highest gold reward on a curve and the √KL where it falls (the first, on a tie)."""
    best = max(rows, key=lambda row: row["gold"])
    return {"peak_gold_reward": best["gold"], "peak_sqrt_kl": best["sqrt_kl"]}


def write_curve(directory: Path, rows: list[dict[str, float]]) -> None:
    """``rows`` as the TSV dvc.yaml declares as the stage's gold-vs-proxy plot."""
    columns = list(rows[0])
    lines = ["\t".join(columns)] + ["\t".join(f"{row[column]:.6g}" for column in columns) for row in rows]
    (directory / CURVE_FILE).write_text("\n".join(lines) + "\n")
