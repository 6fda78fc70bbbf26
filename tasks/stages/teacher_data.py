"""Stage `teacher_data`: sequence-level distillation's data (DeepSeek-R1-Distill), the teacher's verified responses.

The teacher (``distill.teacher``) samples ``samples_per_prompt`` responses to each of the first ``num_prompts``
training prompts; the verified ones, distinct and at most ``max_per_prompt`` a prompt, are the student's SFT
data (``train.jsonl``), with the acceptance rate overall and by difficulty. R1's rejection sampling
(``tasks/stages/rejection_sampling.py``) does the sampling and the checking.
"""

from tasks.common.artifacts import atomic_output, stage_dir
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live
from tasks.common.training import make_deterministic
from tasks.data.datasets import read_examples, write_jsonl
from tasks.stages.rejection_sampling import sample_and_verify


def run(stage: StageRun) -> None:
    params, cfg, teacher = stage.params, stage.config, stage.inputs["teacher"]
    make_deterministic(params.seed)
    train_file = stage.inputs["data"] / "train.jsonl"
    prompts = read_examples(train_file)[: cfg.num_prompts]
    kept, statistics = sample_and_verify(params, cfg, "teacher_data", teacher, prompts, train_file)
    if not kept:
        raise ValueError(
            f"teacher_data: the teacher (distill.teacher={params.distill.teacher}) had no response verified on "
            f"{len(prompts)} prompts; there is nothing to distil"
        )
    with atomic_output(stage_dir("teacher_data")) as out, stage_live("teacher_data") as live:
        out.mkdir()
        write_jsonl(out / "train.jsonl", kept)
        for name, value in statistics.items():
            live.log_metric(name, int(value) if name == "accepted" else value, plot=False)
    print(f"teacher_data: kept {len(kept)} verified responses to {len(prompts)} prompts", flush=True)
