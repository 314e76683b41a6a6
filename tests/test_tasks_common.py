"""Record files: resolution (file, dir + split, glob), formats and error messages."""

import json

import pytest

from gdpo_jax.data.loaders import (
    RecordError,
    get_field,
    iter_records,
    normalize_messages,
    resolve_files,
    sample_path,
    samples_dir,
    write_jsonl,
    write_parquet,
)
from gdpo_jax.tasks import get_task


def test_resolve_dir_split_glob(tmp_path):
    for name in ("train.jsonl", "train-00001.parquet", "test.jsonl", "notes.txt"):
        (tmp_path / name).write_text("")
    assert [p.split("/")[-1] for p in resolve_files(tmp_path, "train")] == [
        "train-00001.parquet",
        "train.jsonl",
    ]
    assert len(resolve_files(tmp_path)) == 3
    assert len(resolve_files(str(tmp_path / "t*.jsonl"))) == 2
    (tmp_path / "sub" / "data").mkdir(parents=True)
    (tmp_path / "sub" / "data" / "test-0.parquet").write_text("")
    assert resolve_files(tmp_path / "sub", "test")[0].endswith("data/test-0.parquet")
    with pytest.raises(FileNotFoundError, match="for split 'dev'"):
        resolve_files(tmp_path, "dev")
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_files(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="unsupported data file type"):
        resolve_files(tmp_path / "notes.txt")


def test_formats_round_trip(tmp_path):
    recs = [{"a": 1, "b": {"c": [1, 2]}}, {"a": 2, "b": {"c": []}}]
    write_jsonl(recs, tmp_path / "x.jsonl")
    write_parquet(recs, tmp_path / "y.parquet")
    (tmp_path / "z.json").write_text(json.dumps(recs))
    (tmp_path / "w.json").write_text(
        "\n".join(json.dumps(r) for r in recs)
    )  # JSON Lines named .json
    for f in ("x.jsonl", "y.parquet", "z.json", "w.json"):
        assert [r for _, _, r in iter_records(tmp_path / f)] == recs, f
    rows = list(iter_records(tmp_path / "x.jsonl", backend="datasets"))
    assert [r["a"] for _, _, r in rows] == [1, 2]


def test_errors_name_file_row_field(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n[1, 2]\n')
    with pytest.raises(RecordError, match=r"a.jsonl, row 1: a record must be a JSON object"):
        list(iter_records(tmp_path / "a.jsonl"))
    (tmp_path / "b.parquet").write_text("not parquet")
    with pytest.raises(RecordError, match="b.parquet: cannot read parquet"):
        list(iter_records(tmp_path / "b.parquet"))
    with pytest.raises(
        RecordError, match=r"f.jsonl, row 3, field 'reward_model.ground_truth': missing"
    ):
        get_field({"reward_model": {"style": "rule"}}, "reward_model.ground_truth", "f.jsonl", 3)
    assert get_field({"a": {"b": 2}}, "a.b", "f", 0) == 2
    assert normalize_messages("hi", "f", 0) == [{"role": "user", "content": "hi"}]
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert normalize_messages(json.dumps(msgs), "f", 0) == msgs
    with pytest.raises(RecordError, match=r"row 4, field 'prompt\[1\].content'"):
        normalize_messages([msgs[0], {"role": "user", "content": 3}], "f", 4)


def test_every_shipped_sample_loads():
    import os

    loaders = {"toolcall": "toolcall", "math": "math", "code": "code"}
    files = sorted(os.listdir(samples_dir()))
    assert len(files) >= 7
    for f in files:
        task = get_task(loaders[f.split("_")[0]])
        assert len(task.load(sample_path(f))) >= 3, f
    with pytest.raises(FileNotFoundError, match="available"):
        sample_path("nope.jsonl")
    with pytest.raises(KeyError, match="known tasks"):
        get_task("chess")
