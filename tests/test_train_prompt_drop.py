"""Prompts longer than sampling.max_prompt_len: the trainer says what it drops, from the
held-out split too, and stops with a named setting when no training prompt is left."""

from __future__ import annotations

import logging

import pytest

from gdpo_jax.tasks import TaskData
from gdpo_jax.train.config import ConfigError
from gdpo_jax.train.loop import Trainer
from tests._train_fixtures import tiny_config


def _records(lengths: list[int]) -> list[dict]:
    # Token-id prompts are used as they are: a prompt of length n is n tokens.
    return [{"prompt": [7] * n, "id": i} for i, n in enumerate(lengths)]


def _task(train: list[int], held_out: list[int]) -> TaskData:
    return TaskData(train=_records(train), eval=_records(held_out), evaluate=None)


def test_held_out_prompts_dropped_are_logged(tmp_path, caplog):
    # The held-out split was cut silently (only training drops were logged), so eval
    # metrics covered a subset without saying so.
    cfg = tiny_config(str(tmp_path))  # sampling.max_prompt_len = 8
    task = _task(train=[3, 5, 9, 8, 12, 2], held_out=[4, 9, 8, 10])
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.train"):
        t = Trainer(cfg, task=task)
    text = caplog.text
    assert "dropped 2 training prompts longer than sampling.max_prompt_len=8" in text
    assert "dropped 2 of 4 held-out prompts longer than sampling.max_prompt_len=8" in text
    assert "eval metrics cover the other 2" in text
    assert [r["id"] for r in t.eval_records] == [0, 2]
    assert t.stream.num_records == 4
    assert t.prompts_dropped == {"train": 2, "eval": 2}


def test_no_training_prompt_fits_names_the_setting(tmp_path):
    # It failed in the prompt stream: "0 training records cannot be split over 1 processes."
    cfg = tiny_config(str(tmp_path))
    with pytest.raises(ConfigError) as e:
        Trainer(cfg, task=_task(train=[9, 15, 11], held_out=[4]))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("config.sampling.max_prompt_len=8 leaves no training prompt")
    assert "3 prompts are 9 to 15 tokens long" in msg
    assert msg.endswith("set it to at least 9 (15 keeps them all).")
    with pytest.raises(
        ConfigError, match=r"3 prompts are 10 tokens long; set it to at least 10\.$"
    ):
        Trainer(cfg, task=_task(train=[10, 10, 10], held_out=[4]))
