"""Stage `data`: the train and held-out splits, generated from the seed or read from shards of your own under data/."""

from tasks.common.artifacts import DATA_DIR, atomic_output
from tasks.common.registry import StageRun
from tasks.common.tracking import stage_live
from tasks.data.datasets import generate_splits, read_shards, write_jsonl


def run(stage: StageRun) -> None:
    params, cfg = stage.params, stage.config
    # Every row of every shard of your own is validated before anything is generated or written.
    train = read_shards(cfg.train_file, params.task.name) if cfg.train_file else None
    test = read_shards(cfg.test_file, params.task.name) if cfg.test_file else None
    if train is None or test is None:
        generated_train, generated_test = generate_splits(params.task, cfg.num_train, cfg.num_test, params.seed)
        train = generated_train if train is None else train
        test = generated_test if test is None else test
    overlap = {e.prompt for e in train} & {e.prompt for e in test}
    if overlap:
        raise ValueError(f"data: {len(overlap)} prompt(s) are in both splits, e.g. {sorted(overlap)[0]!r}")

    with atomic_output(DATA_DIR) as out, stage_live("data") as live:
        out.mkdir()
        write_jsonl(out / "train.jsonl", train)
        write_jsonl(out / "test.jsonl", test)
        live.log_metric("num_train", len(train), plot=False)
        live.log_metric("num_test", len(test), plot=False)
