"""Your data refused before any work: a malformed row of a dataset or of preference pairs, an empty file, a link
out of data/ or a corrupt shard is named by file and line (or key) before a stage, Ray or Prefect starts, and a
stage that fails on one leaves its previous output as it was; good rows, repeats and shards are read as given."""

import json
import subprocess

import pytest

from flows.cli import main
from tests.conftest import ENV, make_project, produced

GOOD_ROW = {
    "task": "arithmetic",
    "prompt": "12+30=",
    "answer": "42",
    "solution": "<think>2+0+0=2,1+3+0=4</think><answer>42</answer>",
}

COUNTDOWN_ROW = {
    "task": "countdown",
    "prompt": "49 from 3,25,27:",
    "answer": "25+27-3",
    "solution": "<think>25+27=52,52-3=49</think><answer>25+27-3</answer>",
    "meta": {"numbers": [3, 25, 27], "target": 49},
}

# GOOD_ROW and OTHER_GOOD_ROW are arithmetic problems: a project reads rows of its own task.name only.
ARITHMETIC = "task.name=arithmetic"
OTHER_GOOD_ROW = {**GOOD_ROW, "prompt": "11+31=", "solution": "<think>1+1+0=2,1+3+0=4</think><answer>42</answer>"}

MALFORMED_ROWS = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({k: v for k, v in GOOD_ROW.items() if k != "answer"}), "missing key 'answer'"),
    (json.dumps({**GOOD_ROW, "prompt": 12}), "'prompt' must be a non-empty string"),
    (json.dumps({**GOOD_ROW, "prompt": "  "}), "'prompt' must be a non-empty string"),
    (json.dumps({**GOOD_ROW, "task": "chess"}), "unknown task 'chess'"),
    (json.dumps({**GOOD_ROW, "solution": "42"}), "not of the form"),
    (json.dumps({**GOOD_ROW, "solution": "<think></think><answer>41</answer>"}), "does not pass the task's verifier"),
    (json.dumps({**GOOD_ROW, "meta": [1]}), "'meta' must be a JSON object"),
    (json.dumps({**GOOD_ROW, "task": "countdown", "solution": "<think></think><answer>1+2</answer>"}), "'meta' lacks"),
    (json.dumps({**GOOD_ROW, "label": 1}), "unknown key(s) label"),
    (
        json.dumps({**GOOD_ROW, "prompt": "2+2=", "answer": "5", "solution": "<think></think><answer>5</answer>"}),
        "'answer' '5' is not what the prompt '2+2=' gives (4)",
    ),
    (json.dumps({**COUNTDOWN_ROW, "prompt": "50 from 3,25,27:"}), "does not state meta's numbers and target"),
    (json.dumps({**COUNTDOWN_ROW, "meta": {"numbers": [3, 25, 27, 1], "target": 49}}), "does not state meta's"),
    ('{"prompt": "12+30=", "answer": "4\udcff"}', "not UTF-8 text"),
    (json.dumps({**GOOD_ROW, "prompt": "1" * 20_000}), "'prompt' is 20000 characters, over the 16384"),
    (json.dumps({**GOOD_ROW, "meta": {"note": "x" * 2_000_000}}), "bytes, over the 1048576 a row may hold"),
    (json.dumps(COUNTDOWN_ROW), "a 'countdown' row in a 'arithmetic' project (task.name)"),
]


@pytest.mark.parametrize(("bad_row", "message"), MALFORMED_ROWS, ids=lambda v: str(v)[:30])
def test_malformed_dataset_row_is_rejected_naming_file_and_line(project, capsys, bad_row, message):
    rows = [json.dumps(GOOD_ROW), json.dumps(OTHER_GOOD_ROW), bad_row]
    # surrogateescape: a lone surrogate in a case stands for a byte that is not UTF-8
    (project / "data/bad.jsonl").write_bytes(("\n".join(rows) + "\n").encode("utf-8", "surrogateescape"))
    assert main(["stage", "data", ARITHMETIC, "data.train_file=data/bad.jsonl"]) == 2
    error = capsys.readouterr().err
    assert "data/bad.jsonl:3:" in error and message in error
    assert produced(project) == []


GOOD_PAIR = {"prompt": "12+30=", "chosen": "<answer>42</answer>", "rejected": "<answer>41</answer>"}

MALFORMED_PAIRS = [
    ("{not json", "not valid JSON"),
    (json.dumps({k: v for k, v in GOOD_PAIR.items() if k != "rejected"}), "missing key 'rejected'"),
    (json.dumps({**GOOD_PAIR, "chosen": ""}), "'chosen' must be a non-empty string"),
    (json.dumps({**GOOD_PAIR, "rejected": GOOD_PAIR["chosen"]}), "'chosen' and 'rejected' are the same response"),
    (json.dumps({**GOOD_PAIR, "meta": {"gold_chosen": "high"}}), "'meta.gold_chosen' must be a number"),
    (json.dumps({**GOOD_PAIR, "score": 1}), "unknown key(s) score"),
    (json.dumps({**GOOD_PAIR, "chosen": "1" * 20_000}), "'chosen' is 20000 characters, over the 16384"),
    (json.dumps({**GOOD_PAIR, "rejected": "2" * 16_385}), "'rejected' is 16385 characters, over the 16384"),
    (json.dumps({**GOOD_PAIR, "meta": {"gold_chosen": float("nan")}}), "'meta.gold_chosen' must be a finite number"),
    (json.dumps({**GOOD_PAIR, "meta": {"gold_rejected": float("-inf")}}), "'meta.gold_rejected' must be a finite"),
    ('{"prompt": "12+30=", "chosen": "\udcff"}', "not UTF-8 text"),
]


@pytest.mark.parametrize(("bad_row", "message"), MALFORMED_PAIRS, ids=lambda v: str(v)[:30])
def test_malformed_preference_row_is_rejected_before_any_sampling(project, capsys, bad_row, message):
    (project / "data").mkdir(exist_ok=True)
    (project / "data/bad.jsonl").write_bytes(
        ("\n".join([json.dumps(GOOD_PAIR), bad_row]) + "\n").encode("utf-8", "surrogateescape")
    )
    assert main(["stage", "preferences", "preferences.train_file=data/bad.jsonl"]) == 2
    error = capsys.readouterr().err
    assert "bad.jsonl:2:" in error and message in error
    assert produced(project) == []


def test_repeated_rows_are_kept_and_said_with_their_count_and_first_place(project, capsys):
    rows = [GOOD_ROW, OTHER_GOOD_ROW, GOOD_ROW, GOOD_ROW]
    (project / "data/mine.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["stage", "data", ARITHMETIC, "data.train_file=data/mine.jsonl", "data.num_test=5"]) == 0
    warned = capsys.readouterr().err
    assert "data/mine.jsonl: 2 row(s) repeat an earlier one" in warned
    assert "(data/mine.jsonl:3 repeats data/mine.jsonl:1)" in warned
    assert len((project / "artifacts/data/train.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize("link", ["file", "directory", "shard"])
def test_a_link_out_of_data_is_refused_naming_the_key_and_the_link(project, tmp_path_factory, capsys, link):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "rows.jsonl").write_text(json.dumps(GOOD_ROW) + "\n")
    if link == "file":
        (project / "data/rows.jsonl").symlink_to(outside / "rows.jsonl")
        source, named = "data/rows.jsonl", "data/rows.jsonl"
    elif link == "directory":
        (project / "data/shards").symlink_to(outside, target_is_directory=True)
        source, named = "data/shards", "data/shards/rows.jsonl"
    else:
        (project / "data/shards").mkdir()
        (project / "data/shards/a.jsonl").write_text(json.dumps(OTHER_GOOD_ROW) + "\n")
        (project / "data/shards/b.jsonl").symlink_to(outside / "rows.jsonl")
        source, named = "data/shards", "data/shards/b.jsonl"
    assert main(["stage", "data", ARITHMETIC, f"data.train_file={source}"]) == 2
    refused = f"data.train_file: '{named}' is a link to '{outside / 'rows.jsonl'}', outside data/"
    assert refused in capsys.readouterr().err
    assert produced(project) == []


def test_empty_dataset_file_is_rejected(project, capsys):
    (project / "data/bad.jsonl").write_text("\n")
    assert main(["stage", "data", ARITHMETIC, "data.train_file=data/bad.jsonl"]) == 2
    assert "data/bad.jsonl: no rows" in capsys.readouterr().err


def test_user_jsonl_is_accepted_and_kept_apart_from_the_generated_split(project):
    rows = [GOOD_ROW, {**GOOD_ROW, "prompt": "30+12=", "solution": "<think>0+2+0=2,3+1+0=4</think><answer>42</answer>"}]
    (project / "data/mine.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["stage", "data", ARITHMETIC, "data.test_file=data/mine.jsonl", "data.num_train=50"]) == 0
    test = [json.loads(line) for line in (project / "artifacts/data/test.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (project / "artifacts/data/train.jsonl").read_text().splitlines()]
    assert [row["prompt"] for row in test] == ["12+30=", "30+12="]
    assert len(train) == 50 and not {row["prompt"] for row in train} & {"12+30=", "30+12="}


@pytest.mark.parametrize("source", ["data/shards", "data/shards/*.jsonl"])
def test_shards_of_a_directory_or_glob_are_read_in_name_order(project, source):
    shards = project / "data/shards"
    shards.mkdir()
    (shards / "b.jsonl").write_text(json.dumps(OTHER_GOOD_ROW) + "\n")
    (shards / "a.jsonl").write_text(json.dumps(GOOD_ROW) + "\n")
    (shards / "notes.txt").write_text("not a shard")
    assert main(["stage", "data", ARITHMETIC, f"data.train_file={source}", "data.num_test=5"]) == 0
    train = [json.loads(line) for line in (project / "artifacts/data/train.jsonl").read_text().splitlines()]
    assert [row["prompt"] for row in train] == ["12+30=", "11+31="]


def test_a_corrupt_shard_is_named_by_file_and_line(project, capsys):
    shards = project / "data/shards"
    shards.mkdir()
    (shards / "1.jsonl").write_text(json.dumps(GOOD_ROW) + "\n")
    (shards / "2.jsonl").write_text(json.dumps(OTHER_GOOD_ROW) + "\n" + json.dumps({**GOOD_ROW, "answer": "41"}) + "\n")
    assert main(["stage", "data", ARITHMETIC, "data.train_file=data/shards"]) == 2
    assert "data/shards/2.jsonl:2:" in capsys.readouterr().err
    assert produced(project) == []


def test_a_failing_stage_leaves_the_previous_output_untouched(project, capsys):
    assert main(["stage", "data", "data.num_train=50", "data.num_test=5"]) == 0
    before = {p.name: p.read_bytes() for p in (project / "artifacts/data").iterdir()}
    (project / "data/bad.jsonl").write_text(json.dumps(GOOD_ROW) + "\n{broken\n")
    assert main(["stage", "data", ARITHMETIC, "data.train_file=data/bad.jsonl"]) == 2
    assert {p.name: p.read_bytes() for p in (project / "artifacts/data").iterdir()} == before
    assert not list((project / "artifacts").glob(".tmp-*"))


@pytest.mark.parametrize("command", ["retrain", "run"])
def test_a_bad_shard_is_named_before_ray_or_prefect_start(tmp_path, command):
    project = make_project(tmp_path)
    (project / "data/shards").mkdir()
    (project / "data/shards/1.jsonl").write_text("\n")  # a shard, with no rows
    # Neither answers: had either been reached first, its own error would come instead of the shard's.
    env = {**ENV, "PREFECT_API_URL": "http://127.0.0.1:9/api", "RAY_ADDRESS": "127.0.0.1:9"}
    result = subprocess.run(
        ["alignflow", command, "sft", "data.train_file=data/shards"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    if command == "run":
        assert result.stderr == "alignflow: error: data/shards/1.jsonl: no rows\n"
        return
    # A retrain sets the unversioned shard aside, so the next scheduled run trains on the rest.
    assert result.stderr == (
        "alignflow: error: data/shards/1.jsonl: no rows; the new shard(s) moved to "
        "data/quarantine/1.jsonl: fix and move them back\n"
    )
    assert not (project / "data/shards/1.jsonl").exists()
    assert (project / "data/quarantine/1.jsonl").read_text() == "\n"
