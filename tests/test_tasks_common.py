"""Record files: resolution (file, dir + split, glob), formats and error messages."""

import json
import logging
import os

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
    # Plain text that looks like a JSON list is a prompt, not a malformed message list.
    for text in ("[1, 2, 3]", "[]", '["a", "b"]', "[x]"):
        assert normalize_messages(text, "f", 0) == [{"role": "user", "content": text}]
    with pytest.raises(RecordError, match="each message needs 'role' and 'content'"):
        normalize_messages('[{"role": "user"}]', "f", 0)  # a message list, malformed
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


def test_utf8_byte_order_mark_is_not_data(tmp_path):
    # Windows editors save "UTF-8 with BOM"; it was read as part of row 0 (invalid JSON).
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.jsonl").write_bytes(bom + b'{"a": 1}\r\n{"a": 2}\r\n')
    (tmp_path / "b.json").write_bytes(bom + b'[{"a": 1}, {"a": 2}]')
    (tmp_path / "c.json").write_bytes(bom + b'{"a": 1}\n{"a": 2}\n')  # JSON Lines as .json
    for f in ("a.jsonl", "b.json", "c.json"):
        assert [r for _, _, r in iter_records(tmp_path / f)] == [{"a": 1}, {"a": 2}], f


def test_non_utf8_file_is_a_record_error_naming_file_and_line(tmp_path):
    # Latin-1 "café": a bare UnicodeDecodeError named neither the file nor the row.
    (tmp_path / "l.jsonl").write_bytes(b'{"p": "ok"}\n\n{"p": "caf\xe9"}\n')
    with pytest.raises(RecordError, match=r"l\.jsonl, row 2: not UTF-8 .*0xe9") as e:
        list(iter_records(tmp_path / "l.jsonl"))
    assert e.value.row == 2
    (tmp_path / "l.json").write_bytes(b'[\n {"p": "ok"},\n {"p": "caf\xe9"}\n]')
    with pytest.raises(RecordError, match=r"l\.json: line 3: not UTF-8 .*0xe9"):
        list(iter_records(tmp_path / "l.json"))


def test_a_lone_utf16_surrogate_is_a_record_error_naming_file_and_row(tmp_path):
    # "\ud83d" (half an emoji, cut by a scraper) loaded, then hashing the records
    # (UnicodeEncodeError) and the tokenizer failed after the build, naming no record.
    # A whole pair ("\ud83d\ude00") is one character and loads.
    (tmp_path / "s.jsonl").write_text('{"p": "ok \\ud83d\\ude00"}\n{"p": "cut \\ud83d"}\n')
    with pytest.raises(RecordError, match=r"s\.jsonl, row 1: holds a lone UTF-16 surrogate"):
        list(iter_records(tmp_path / "s.jsonl"))
    (tmp_path / "s.json").write_text('[{"p": "ok \\ud83d\\ude00"}, {"p": "\\uDE00"}]')
    with pytest.raises(RecordError, match=r"s\.json, row 1: .*\\ude00"):
        list(iter_records(tmp_path / "s.json"))
    (tmp_path / "w.jsonl").write_text('{"p": "ok \\ud83d\\ude00"}\n')
    assert [r["p"] for _, _, r in iter_records(tmp_path / "w.jsonl")] == ["ok \U0001f600"]


def test_json_lines_as_json_keeps_unicode_line_separators_inside_strings(tmp_path):
    # write_jsonl keeps U+2028 / U+0085 raw; str.splitlines() split records at them.
    text = '{"p": "a\u2028b"}\n{"p": "c\x85d"}\n'
    (tmp_path / "u.json").write_bytes(text.encode("utf-8"))
    assert [r["p"] for _, _, r in iter_records(tmp_path / "u.json")] == ["a\u2028b", "c\x85d"]


def test_broken_json_array_reports_its_own_line_and_column(tmp_path):
    # A pretty-printed array with a missing comma after line 3: it fell into the JSON
    # Lines fallback and was reported as "row 0 ... column 2".
    (tmp_path / "p.json").write_text('[\n  {"a": 1},\n  {"a": 2}\n  {"a": 3}\n]\n')
    with pytest.raises(RecordError, match=r"p\.json: invalid JSON .*line 4, column 3") as e:
        list(iter_records(tmp_path / "p.json"))
    assert e.value.row is None
    (tmp_path / "o.json").write_text('{\n  "a": 1,\n}\n')  # a broken single object
    with pytest.raises(RecordError, match=r"o\.json: invalid JSON .*line 3, column 1"):
        list(iter_records(tmp_path / "o.json"))
    (tmp_path / "l.json").write_text('{"a": 1}\n{"a": \n')  # JSON Lines: its row
    with pytest.raises(RecordError, match=r"l\.json, row 1: invalid JSON"):
        list(iter_records(tmp_path / "l.json"))


def test_existing_path_with_glob_characters_and_globs_keep_data_files(tmp_path):
    d = tmp_path / "set[1]"
    d.mkdir()
    (d / "train.jsonl").write_text('{"a": 1}\n')
    # An existing path is that path, not a pattern ("set[1]" as a glob means "set1").
    assert resolve_files(d / "train.jsonl") == [str(d / "train.jsonl")]
    assert [r for _, _, r in iter_records(d / "train.jsonl")] == [{"a": 1}]
    (tmp_path / "g").mkdir()
    for name in ("a.parquet", "b.jsonl"):
        (tmp_path / "g" / name).write_text("")
    (tmp_path / "g" / "README.md").write_text("")
    (tmp_path / "g" / "sub.jsonl").mkdir()  # a directory, despite its name
    assert [p.split("/")[-1] for p in resolve_files(str(tmp_path / "g" / "*"))] == [
        "a.parquet",
        "b.jsonl",
    ]
    with pytest.raises(FileNotFoundError, match=r"no .* files match .*skipped: .*README\.md"):
        resolve_files(str(tmp_path / "g" / "R*"))


def test_datasets_backend_reads_files_in_the_given_order(tmp_path):
    # It grouped files by kind: [a.parquet, b.jsonl, c.parquet] read a, c, b.
    write_parquet([{"k": "a0"}, {"k": "a1"}], tmp_path / "a.parquet")
    (tmp_path / "b.jsonl").write_text('{"k": "b0"}\n')
    write_parquet([{"k": "c0"}], tmp_path / "c.parquet")
    files = [tmp_path / "a.parquet", tmp_path / "b.jsonl", tmp_path / "c.parquet"]
    want = ["a0", "a1", "b0", "c0"]
    assert [r["k"] for _, _, r in iter_records(files)] == want
    assert [r["k"] for _, _, r in iter_records(files, backend="datasets")] == want


def _write(path, recs):
    """JSON Lines, JSON or Parquet by the (any-case) extension."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ext = path.suffix.lower()
    if ext == ".parquet":
        write_parquet(recs, path)
    elif ext == ".json":
        path.write_text(json.dumps(recs))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_directory_splits_are_named_as_hf_datasets_names_them(tmp_path):
    # Sharded `train.part0.jsonl` and upper-case `train.JSONL` / `test.Json` were missed:
    # "no ... files for split 'train'".
    split_files = {
        "train.part1.jsonl": ["t1"],
        "train.part0.jsonl": ["t0a", "t0b"],
        "my_train_v2.json": ["my"],
        "old-train.JSONL": ["old"],
        "train/shard.jsonl": ["dir"],
        "test.Json": ["e0", "e1"],
        "test/sub/a.parquet": ["e2"],
    }
    others = ["trainer.jsonl", "contrain.jsonl", ".train.jsonl", "train/.x.jsonl"]
    for name, keys in split_files.items():
        _write(tmp_path / name, [{"k": k} for k in keys])
    for name in others:  # not split files: another word, or hidden
        _write(tmp_path / name, [{"k": "no"}])
    (tmp_path / "test" / "notes.txt").write_text("")

    def names(split):
        return [os.path.relpath(p, tmp_path) for p in resolve_files(tmp_path, split)]

    # Sorted by path ("." < "/"), every shard of the split, nothing else.
    assert names("train") == [
        "my_train_v2.json",
        "old-train.JSONL",
        "train.part0.jsonl",
        "train.part1.jsonl",
        "train/shard.jsonl",
    ]
    assert names("test") == ["test.Json", "test/sub/a.parquet"]
    want = ["my", "old", "t0a", "t0b", "t1", "dir"]
    assert [r["k"] for _, _, r in iter_records(tmp_path, split="train")] == want
    got = [r["k"] for _, _, r in iter_records(tmp_path, split="train", backend="datasets")]
    assert got == want
    assert [r["k"] for _, _, r in iter_records(tmp_path, split="test")] == ["e0", "e1", "e2"]
    # Upper-case extensions also count in a glob and as a single file.
    assert [os.path.basename(p) for p in resolve_files(str(tmp_path / "old-*"))] == [
        "old-train.JSONL"
    ]
    assert resolve_files(tmp_path / "test.Json") == [str(tmp_path / "test.Json")]


def test_a_split_is_also_found_under_its_other_hf_names(tmp_path):
    # `training.jsonl`, `dev/` and `eval-*.parquet` were not split files ("no ... files for
    # split"): HF `datasets` takes train/training, validation/valid/val/dev and
    # test/testing/eval/evaluation as one split each.
    split_files = {
        "training.jsonl": "train",
        "my-train.jsonl": "train",
        "dev/0.jsonl": "validation",
        "valid.json": "validation",
        "val_1.jsonl": "validation",
        "eval-00000-of-00001.parquet": "test",
        "evaluation/x.jsonl": "test",
        "testing.jsonl": "test",
    }
    for name in split_files:
        _write(tmp_path / name, [{"k": name}])
    _write(tmp_path / "interval.jsonl", [{"k": "no"}])  # "val" inside a word: no split
    for split in ("train", "validation", "test"):
        want = sorted(n for n, s in split_files.items() if s == split)
        got = [os.path.relpath(p, tmp_path) for p in resolve_files(tmp_path, split)]
        assert got == want, split
    _write(tmp_path / "dev_eval.jsonl", [{"k": 0}])
    with pytest.raises(ValueError, match=r"dev_eval\.jsonl: .*split 'test' and split 'validation'"):
        resolve_files(tmp_path, "test")
    # A split outside the three keeps its own name only.
    _write(tmp_path / "random-00000-of-00001.jsonl", [{"k": "r"}])
    assert resolve_files(tmp_path, "random") == [str(tmp_path / "random-00000-of-00001.jsonl")]


def test_two_paths_to_one_file_in_a_split_directory_are_read_once(tmp_path, caplog):
    # A link beside its file (or two links to one file) read the records twice.
    _write(tmp_path / "shards" / "a.jsonl", [{"k": "a"}])
    _write(tmp_path / "shards" / "b.jsonl", [{"k": "b"}])
    (tmp_path / "train").mkdir()
    os.symlink(tmp_path / "shards" / "a.jsonl", tmp_path / "train" / "a.jsonl")
    os.symlink(tmp_path / "shards" / "a.jsonl", tmp_path / "train" / "c.jsonl")
    os.symlink(tmp_path / "shards" / "b.jsonl", tmp_path / "train" / "b.jsonl")
    with caplog.at_level(logging.WARNING, logger="gdpo_jax"):
        recs = [r["k"] for _, _, r in iter_records(tmp_path, split="train")]
    assert recs == ["a", "b"]
    assert any("train/c.jsonl is a second path to" in r.getMessage() for r in caplog.records)


def test_a_name_of_two_splits_is_an_error_naming_both(tmp_path):
    (tmp_path / "a").mkdir()
    _write(tmp_path / "a" / "train.jsonl", [{"k": 1}])
    _write(tmp_path / "a" / "train_test.jsonl", [{"k": 2}])
    for split, other in (("train", "test"), ("test", "train")):
        with pytest.raises(
            ValueError, match=rf"train_test\.jsonl: .*split '{split}' and split '{other}'"
        ):
            resolve_files(tmp_path / "a", split)
    _write(tmp_path / "b" / "validation-train" / "0.jsonl", [{"k": 3}])
    with pytest.raises(ValueError, match=r"validation-train: .*'train' and split 'validation'"):
        resolve_files(tmp_path / "b", "train")


def test_overlapping_path_list_reads_each_file_once(tmp_path, caplog):
    # ["d/*.jsonl", "d/b.jsonl"] read b.jsonl twice: its records counted double.
    d = tmp_path / "d"
    for name in ("a", "b", "c"):
        _write(d / f"{name}.jsonl", [{"k": name}])
    with caplog.at_level(logging.WARNING, logger="gdpo_jax"):
        recs = iter_records([str(d / "*.jsonl"), str(d / "b.jsonl"), f"{tmp_path}/./d/a.jsonl"])
        assert [r["k"] for _, _, r in recs] == ["a", "b", "c"]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "b.jsonl is listed twice" in warned[0]
    assert "a.jsonl is listed twice" in warned[1]
    # The first occurrence keeps its place.
    recs = iter_records([d / "b.jsonl", str(d / "*.jsonl")])
    assert [r["k"] for _, _, r in recs] == ["b", "a", "c"]
