"""Recipe search for SmolLM2 on the lent GPU: which DPO, distillation and GRPO settings make the real model better.

A pipeline on SmolLM2 takes hours on a CPU without bfloat16, so the settings the overlay should use are searched
here, on one GPU in minutes, with the pipeline's own pieces (the task and its verifier, the gold judge and its
noisy labels, the chat-template prompt format, the preference losses, the student's layer cut) and a plain loop
around them; the chosen settings are then run through the pipelines themselves (docs/real-models.md). Each result
is greedy pass@1 and gold utility on the held-out problems, with the paired standard error of the gain over the
model trained from. Every experiment appends its row to ``--out`` as soon as it ends, and experiments past
``--budget-s`` are skipped, so a run cut short still reports what it measured.

    python -m bench.gpu.smollm2_recipes --gguf PATH --out results.jsonl [--tiny]
"""

import argparse
import copy
import functools
import time
from pathlib import Path

from torch import nn

from bench.gpu.smollm2_loop import (
    LABEL_NOISE,
    Lab,
    dpo,
    evaluate,
    gain,
    grpo,
    judged_pairs,
    logit_distill,
    sample,
    sft,
    summary,
)
from models.student import kept_layers, with_layers
from tasks.data.problems import score_response


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiny", action="store_true", help="a few steps and problems: a check that it runs")
    parser.add_argument("--budget-s", type=float, default=480)
    parser.add_argument("--only", default="distill,dpo,grpo", help="which experiment families, in order")
    parser.add_argument("--dpo", help="which DPO experiments, in the order to run them (comma-separated names)")
    args = parser.parse_args()
    lab = Lab(args.gguf, args.out, args.tiny, args.budget_s)
    lab.started = time.monotonic()
    worked = [(e.prompt, e.solution) for e in lab.train]

    base = evaluate(lab, lab.base)
    lab.record("base", summary(base))
    cold = sft(lab, lab.base, worked[:2000], steps=40, lr=4e-4)
    cold_eval = evaluate(lab, cold)
    lab.record("sft_cold", {**summary(cold_eval), **gain(cold_eval, base)})

    for family in args.only.split(","):
        if not lab.time_left():
            break
        if family == "dpo":
            run_dpo(lab, cold, cold_eval, None if args.dpo is None else args.dpo.split(","))
        elif family == "distill":
            run_distill(lab, worked)
        elif family == "grpo":
            run_grpo(lab, cold, cold_eval)


def run_dpo(lab: Lab, cold: nn.Module, cold_eval: dict, wanted: list[str] | None) -> None:
    n_small, n_large = (8, 16) if lab.tiny else (96, 400)

    @functools.cache
    def pairs_of(num_prompts: int, noise: float, only_correctness: bool = False) -> tuple[dict, ...]:
        pairs = judged_pairs(lab, cold, lab.train[:num_prompts], 0, noise)
        if only_correctness:  # pairs whose responses differ in correctness (the judge's 0.7 weight), by gold
            return tuple(p for p in pairs if (p["gold_chosen"] >= 0.7) != (p["gold_rejected"] >= 0.7))
        n = max(1, len(pairs))
        lab.record(
            f"pairs_{num_prompts}_noise{noise}",
            {
                "pairs": len(pairs),
                "chosen_correct": round(sum(p["gold_chosen"] >= 0.7 for p in pairs) / n, 3),
                "rejected_correct": round(sum(p["gold_rejected"] >= 0.7 for p in pairs) / n, 3),
                "both_wrong": round(sum(p["gold_chosen"] < 0.7 and p["gold_rejected"] < 0.7 for p in pairs) / n, 3),
                "label_agreement": round(sum(p["gold_chosen"] > p["gold_rejected"] for p in pairs) / n, 3),
            },
        )
        return tuple(pairs)

    overlay = {"steps": 60, "lr": 2e-4, "beta": 0.1, "sft_weight": 2.0}
    grid = [
        ("dpo_overlay", (n_small, LABEL_NOISE), overlay),
        ("dpo_no_sft_term", (n_small, LABEL_NOISE), {**overlay, "sft_weight": 0.0}),
        ("dpo_400", (n_large, LABEL_NOISE), overlay),
        ("dpo_400_no_sft_term", (n_large, LABEL_NOISE), {**overlay, "sft_weight": 0.0}),
        ("dpo_400_lr5e-5", (n_large, LABEL_NOISE), {**overlay, "lr": 5e-5}),
        ("dpo_400_beta0.5", (n_large, LABEL_NOISE), {**overlay, "beta": 0.5}),
        ("dpo_400_200steps", (n_large, LABEL_NOISE), {**overlay, "steps": 200, "lr": 1e-4}),
        ("dpo_400_noise0", (n_large, 0.0), overlay),
        ("dpo_400_correctness_pairs", (n_large, LABEL_NOISE, True), overlay),
        ("ipo_400", (n_large, LABEL_NOISE), {**overlay, "loss": "ipo"}),
        # conservative DPO: the labels agree with the judge about 75% of the time at the default noise
        ("cdpo_400_smoothing0.25", (n_large, LABEL_NOISE), {**overlay, "loss": "cdpo", "label_smoothing": 0.25}),
    ]
    if wanted is not None:
        unknown = set(wanted) - {name for name, _, _ in grid}
        if unknown:
            raise SystemExit(f"--dpo: unknown experiments {sorted(unknown)}; choose from {[n for n, _, _ in grid]}")
        grid = sorted((row for row in grid if row[0] in wanted), key=lambda row: wanted.index(row[0]))
    for name, which, knobs in grid:
        if not lab.time_left():
            continue
        pairs = list(pairs_of(*which))
        if not pairs:
            continue
        model, stats = dpo(lab, cold, pairs, **knobs)
        result = evaluate(lab, model)
        lab.record(name, {**knobs, "pairs": len(pairs), **stats, **summary(result), **gain(result, cold_eval)})
        del model


def run_distill(lab: Lab, worked: list[tuple[str, str]]) -> None:
    if not lab.time_left():
        return
    teacher = sft(lab, lab.base, worked, steps=300, lr=4e-4)
    teacher_eval = evaluate(lab, teacher)
    lab.record("teacher", summary(teacher_eval))

    # teacher_data: one verified sample per prompt, as the overlay's 400 prompts x 4 gave 254 rows
    def teacher_rows(num_prompts: int) -> list[tuple[str, str]]:
        examples = lab.train[:num_prompts]
        responses = sample(lab, teacher, [e.prompt for e in examples], 4, 1.0, seed=1)
        rows = []
        for index, example in enumerate(examples):
            good = [r for r in responses[index * 4 : index * 4 + 4] if score_response(example, r)[1]]
            rows += [(example.prompt, good[0])] if good else []
        # a --tiny run's teacher answers nothing right: its students train on worked solutions instead
        return rows if rows or not lab.tiny else worked[:num_prompts]

    rows_400, rows_1500 = teacher_rows(16 if lab.tiny else 400), teacher_rows(32 if lab.tiny else 1500)
    spaced, contiguous = kept_layers(30, 14), [*range(13), 29]
    grid = [
        ("student_overlay", spaced, rows_400, "sft", 100, 1e-4),
        ("student_1500_rows", spaced, rows_1500, "sft", 600, 1e-4),
        ("student_logit_kd", spaced, rows_1500, "kd", 600, 1e-4),
        ("student_logit_kd_lr5e-4", spaced, rows_1500, "kd", 600, 5e-4),
        ("student_1500_rows_lr5e-4", spaced, rows_1500, "sft", 600, 5e-4),
        ("student_contiguous_kd", contiguous, rows_1500, "kd", 600, 5e-4),
        ("student_kd_1200_steps", spaced, rows_1500, "kd", 1200, 5e-4),
    ]
    for name, keep, rows, how, steps, lr in grid:
        if not lab.time_left():
            continue
        cut = with_layers(copy.deepcopy(teacher), keep)
        start_eval = evaluate(lab, cut)
        if how == "sft":
            model = sft(lab, cut, rows, steps=steps, lr=lr, lora=False)
        else:
            model = logit_distill(lab, cut, teacher, rows, steps=steps, lr=lr)
        result = evaluate(lab, model)
        ratio = result["pass1"] / teacher_eval["pass1"] if teacher_eval["pass1"] else float("nan")
        lab.record(
            name,
            {
                "layers": keep,
                "rows": len(rows),
                "how": how,
                "steps": steps,
                "lr": lr,
                "cut_pass1": start_eval["pass1"],
                **summary(result),
                "of_teacher": round(ratio, 3),
            },
        )
        del model, cut


def run_grpo(lab: Lab, cold: nn.Module, cold_eval: dict) -> None:
    for name, iterations, lr, seed in (
        ("grpo_overlay", 28, 4e-4, 0),
        ("grpo_overlay_seed1", 28, 4e-4, 1),
        ("grpo_overlay_seed2", 28, 4e-4, 2),
        ("grpo_56_iterations", 56, 4e-4, 0),
        ("grpo_lr1e-3", 28, 1e-3, 0),
    ):
        if not lab.time_left():
            continue
        model = grpo(lab, cold, iterations, lr, seed)
        result = evaluate(lab, model)
        lab.record(
            name, {"iterations": iterations, "lr": lr, "seed": seed, **summary(result), **gain(result, cold_eval)}
        )
        del model


if __name__ == "__main__":
    main()
