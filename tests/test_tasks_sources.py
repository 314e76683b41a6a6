"""Held-out split selection of the trainer tasks in gdpo_jax.tasks.sources (task.eval_source)."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from gdpo_jax.data.loaders import write_jsonl
from gdpo_jax.tasks import sources
from gdpo_jax.train.config import base_config


def _recs(tag: str, n: int = 3) -> list[dict]:
    return [{"problem": f"{tag} {i}?", "answer": str(i)} for i in range(n)]


def _cfg(source: str, eval_source: str = ""):
    c = base_config()
    c.task.name, c.task.source, c.task.eval_source = "math", source, eval_source
    return c


def _problems(records) -> set[str]:
    return {r["prompt"][0]["content"] for r in records}


def test_single_file_source_never_evaluates_on_training_data(tmp_path, caplog):
    # Before the fix resolve_files(file, split="test") returned the training file itself.
    src = write_jsonl(_recs("train"), tmp_path / "train.jsonl")
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.train"):
        data = sources._load("math", _cfg(str(src)))
    assert len(data.train) == 3 and data.eval == []
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "periodic eval is off" in msg and "eval_source" in msg


def test_explicit_eval_source_file_is_used(tmp_path):
    src = write_jsonl(_recs("train"), tmp_path / "train.jsonl")
    held = write_jsonl(_recs("held", 2), tmp_path / "held.jsonl")
    data = sources._load("math", _cfg(str(src), str(held)))
    assert len(data.eval) == 2 and not _problems(data.eval) & _problems(data.train)


def test_missing_explicit_eval_source_is_an_error_naming_it(tmp_path):
    src = write_jsonl(_recs("train"), tmp_path / "train.jsonl")
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match=r"config.task.eval_source=.*nope.jsonl"):
        sources._load("math", _cfg(str(src), missing))


def test_directory_source_uses_its_test_split_or_warns(tmp_path, caplog):
    d = tmp_path / "ds"
    os.makedirs(d)
    write_jsonl(_recs("train"), d / "train.jsonl")
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.train"):
        data = sources._load("math", _cfg(str(d)))
    assert data.eval == [] and "no 'test' split" in caplog.text
    write_jsonl(_recs("held", 2), d / "test.jsonl")
    data = sources._load("math", _cfg(str(d)))
    assert len(data.train) == 3 and len(data.eval) == 2
    assert not _problems(data.eval) & _problems(data.train)
    # A directory named like a glob is still a directory: its test split is used (it was
    # taken as one file pattern, so the run had no held-out records).
    glob_named = tmp_path / "set[1]"
    shutil.copytree(d, glob_named)
    data = sources._load("math", _cfg(str(glob_named)))
    assert len(data.train) == 3 and len(data.eval) == 2


def test_directory_source_reads_sharded_and_upper_case_split_files(tmp_path):
    # train.part0/1.jsonl and test.Json were not split files: "no ... files for split 'train'".
    d = tmp_path / "ds"
    write_jsonl(_recs("a", 2), d / "train.part0.jsonl")
    write_jsonl(_recs("b", 3), d / "train.part1.jsonl")
    write_jsonl(_recs("held", 2), d / "test.Json")  # JSON Lines under a .Json name
    c = _cfg(str(d))
    c.task.num_train = c.task.num_eval = 0
    data = sources._load("math", c)

    def firsts(records) -> list[str]:  # in file order
        return [r["prompt"][0]["content"].split("?")[0] for r in records]

    assert firsts(data.train) == ["a 0", "a 1", "b 0", "b 1", "b 2"]
    assert firsts(data.eval) == ["held 0", "held 1"]


def test_file_sources_are_cut_to_num_train_and_num_eval_with_a_log_line(tmp_path, caplog):
    """base_config's counts (2048 / 64) also cut a file source: the run says so, and
    0 keeps every record."""
    src = write_jsonl(_recs("train", 5), tmp_path / "train.jsonl")
    held = write_jsonl(_recs("held", 4), tmp_path / "held.jsonl")
    c = _cfg(str(src), str(held))
    c.task.num_train, c.task.num_eval = 3, 2
    with caplog.at_level(logging.INFO, logger="gdpo_jax.train"):
        data = sources._load("math", c)

    # The files' first records.
    def firsts(records) -> list[str]:
        return sorted(p.split("?")[0] for p in _problems(records))

    assert firsts(data.train) == ["train 0", "train 1", "train 2"]
    assert firsts(data.eval) == ["held 0", "held 1"]
    assert "the first 3 of 5 training records (config.task.num_train; 0 = all)" in caplog.text
    assert "the first 2 of 4 held-out records (config.task.num_eval; 0 = all)" in caplog.text
    caplog.clear()
    c.task.num_train, c.task.num_eval = 0, 0
    with caplog.at_level(logging.INFO, logger="gdpo_jax.train"):
        data = sources._load("math", c)
    assert (len(data.train), len(data.eval)) == (5, 4) and "the first" not in caplog.text
    # Counts at least the file's: nothing cut, nothing logged.
    c.task.num_train, c.task.num_eval = 5, 64
    with caplog.at_level(logging.INFO, logger="gdpo_jax.train"):
        data = sources._load("math", c)
    assert (len(data.train), len(data.eval)) == (5, 4) and "the first" not in caplog.text


@pytest.mark.parametrize("name", ["math", "toolcall"])
def test_synthetic_num_eval_0_turns_eval_off_and_num_train_0_names_the_field(name, caplog):
    # Both used to fail in the loader with "RecordError []: no records".
    c = _cfg("synthetic")
    c.task.name, c.task.num_train, c.task.num_eval = name, 8, 0
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.train"):
        data = sources._load(name, c)
    assert len(data.train) == 8 and data.eval == []
    assert "periodic eval is off" not in caplog.text  # none asked for (train.eval_every=0)
    # A periodic eval asked for without held-out records ran nothing, without a word.
    c.train.eval_every = 5
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.train"):
        sources._load(name, c)
    assert (
        "periodic eval is off: config.task.num_eval=0 generates no held-out records for "
        "config.train.eval_every=5; set config.task.num_eval to 1 or more"
    ) in caplog.text
    c.task.num_train = 0
    with pytest.raises(ValueError, match=r"config\.task\.num_train=0.*1 or more"):
        sources._load(name, c)


def test_file_source_warns_that_task_kwargs_are_ignored(tmp_path, caplog):
    # task.kwargs set the synthetic generator; a file source read past them in silence.
    src = write_jsonl(_recs("train"), tmp_path / "train.jsonl")
    c = _cfg(str(src))
    c.task.kwargs.max_steps = 2
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.train"):
        assert len(sources._load("math", c).train) == 3
    assert "config.task.kwargs ['max_steps'] are ignored" in caplog.text


def test_held_out_records_repeating_training_prompts_are_warned_about(tmp_path, caplog):
    """eval_source = the training file (or a test split that copies train): eval then
    measures recall. The run says how many held-out records repeat a training prompt."""
    src = write_jsonl(_recs("train", 4), tmp_path / "train.jsonl")
    held = write_jsonl(_recs("train", 2) + _recs("held", 3), tmp_path / "held.jsonl")
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.train"):
        data = sources._load("math", _cfg(str(src), str(held)))
    assert len(data.eval) == 5  # nothing removed
    assert f"2 of the 5 held-out records ({held}) repeat a training prompt" in caplog.text
    caplog.clear()
    disjoint = write_jsonl(_recs("held", 3), tmp_path / "disjoint.jsonl")
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.train"):
        sources._load("math", _cfg(str(src), str(disjoint)))
    assert "repeat a training prompt" not in caplog.text


def test_a_malformed_or_empty_data_file_is_one_line_naming_the_field(tmp_path):
    # A RecordError escaped load_task: the CLI printed a 42-line traceback (and SFT did so
    # after its model build) where every other bad input is one line.
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.tasks import load_task

    good = write_jsonl(_recs("train"), tmp_path / "good.jsonl")
    bad = write_jsonl([{"question": "1 + 1?", "answer": "2"}], tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    cases = [
        (_cfg(str(bad)), r"config\.task\.source: .*bad\.jsonl, row 0, field 'prompt'"),
        (_cfg(str(tmp_path / "empty.jsonl")), r"config\.task\.source: .*empty\.jsonl: no records"),
        (_cfg(str(good), str(bad)), r"config\.task\.eval_source: .*bad\.jsonl, row 0"),
    ]
    # The field was guessed by finding the eval_source string in the bad file's path: a
    # glob eval_source blamed task.source, an eval_source directory holding the
    # training file blamed task.eval_source.
    held = tmp_path / "held"
    held.mkdir()
    shutil.copy(bad, held / "part0.jsonl")
    both = tmp_path / "d"
    both.mkdir()
    shutil.copy(bad, both / "train.jsonl")
    write_jsonl(_recs("test"), both / "test.jsonl")
    cases += [
        (_cfg(str(good), str(held / "*.jsonl")), r"config\.task\.eval_source: .*part0\.jsonl"),
        (_cfg(str(both / "train.jsonl"), str(both)), r"config\.task\.source: .*d/train\.jsonl"),
    ]
    for cfg, want in cases:
        with pytest.raises(ConfigError, match=want) as e:
            load_task(cfg)
        assert "\n" not in str(e.value) and "record formats" in str(e.value)


def test_every_records_prompt_is_checked_before_the_build():
    # Only the first 50 training records were checked (and no held-out one): a later
    # record without a prompt, or with prompt=None, failed after the model build, in
    # the length filter, named as prompts[0].
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.tasks import load_task, register_task
    from gdpo_jax.tasks.registry import _TASKS, TaskData

    good = {"prompt": "2 + 2?"}
    for bad, split, got in (
        ({"question": "2 + 2?"}, "training", "no 'prompt' field"),
        ({"prompt": None}, "training", "prompt=None"),
        ({"prompt": [1, "a"]}, "held-out", r"prompt=\[1, 'a'\]"),
    ):
        train = [dict(good) for _ in range(60)]
        held = [dict(good) for _ in range(3)]
        (train if split == "training" else held)[57 if split == "training" else 2] = bad

        @register_task("audit_prompts", synthetic_only=True)
        def _load(cfg, train=train, held=held):
            return TaskData(train=train, eval=held)

        try:
            c = _cfg("synthetic")
            c.task.name = "audit_prompts"
            index = 57 if split == "training" else 2
            with pytest.raises(ConfigError, match=rf"{split} record {index} has {got}"):
                load_task(c)
        finally:
            _TASKS.pop("audit_prompts", None)
    # Every accepted form passes: text, chat messages, token ids (NumPy ones too).
    import numpy as np

    @register_task("audit_prompts", synthetic_only=True)
    def _ok(cfg):
        forms = ["x", [{"role": "user", "content": "x"}], [1, 2], np.array([3, 4])]
        return TaskData(train=[{"prompt": p} for p in forms], eval=[])

    try:
        c = _cfg("synthetic")
        c.task.name = "audit_prompts"
        assert len(load_task(c).train) == 4
    finally:
        _TASKS.pop("audit_prompts", None)


def test_a_file_for_a_task_that_generates_its_records_is_refused(tmp_path):
    # The toy tasks read no file: a task.source or eval_source naming one was ignored, and
    # the run trained on the generated records without a word.
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.tasks import check_task_kwargs, load_task

    src = str(write_jsonl(_recs("train"), tmp_path / "train.jsonl"))
    for name in ("toy_toolcall", "three_binary"):
        for field, fix in (("source", "source=synthetic"), ("eval_source", "eval_source empty")):
            c = _cfg("synthetic")
            c.task.name, c.task[field] = name, src
            with pytest.raises(ConfigError, match=rf"config\.task\.{field}=.* is not read by"):
                check_task_kwargs(c)
            with pytest.raises(ConfigError, match=fix):
                load_task(c)
        c = _cfg("synthetic")
        c.task.name = name
        assert load_task(c).train  # synthetic: as before


def test_chat_template_off_for_a_task_of_chat_messages_is_refused(tmp_path):
    # The sampler refused message-list prompts without the template once the model was
    # built; the SFT warm start of a comparison trained and exported first.
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.tasks import load_task

    c = _cfg(str(write_jsonl(_recs("train"), tmp_path / "train.jsonl")))
    assert isinstance(load_task(c).train[0]["prompt"], list)
    c.task.chat_template = False
    with pytest.raises(ConfigError, match=r"chat_template=False but task 'math' gives chat"):
        load_task(c)
