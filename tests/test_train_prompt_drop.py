"""Prompts longer than sampling.max_prompt_len: the trainer says what it drops, from the
held-out split too, and stops with a named setting when no training prompt is left (or
fewer than the processes that share them). Its errors leave no reward pool running."""

from __future__ import annotations

import logging

import pytest

from gdpo_jax.tasks import TaskData
from gdpo_jax.train import build, loop
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


@pytest.fixture
def runners(monkeypatch):
    """The reward runners the Trainer starts (each owns a worker pool)."""
    made = []

    def record(*args, **kwargs):
        made.append(args)
        raise AssertionError("the reward pool was started before a config error")

    monkeypatch.setattr(loop, "reward_runner", record)
    return made


def _processes(monkeypatch, count: int) -> None:
    monkeypatch.setattr(build, "process_info", lambda: (0, count))


@pytest.mark.parametrize(
    "train, dropped",
    [([3, 9, 12, 15, 5], True), ([3, 4, 5], False)],
)
def test_fewer_training_prompts_than_processes(tmp_path, monkeypatch, runners, train, dropped):
    # It failed in the prompt stream ("2 training records cannot be split over 4
    # processes"), naming no setting, with the reward pool already running.
    _processes(monkeypatch, 4)
    with pytest.raises(ConfigError) as e:
        Trainer(tiny_config(str(tmp_path)), task=_task(train=train, held_out=[4]))
    msg = str(e.value)
    assert "\n" not in msg
    if dropped:
        assert msg.startswith("config.sampling.max_prompt_len=8 keeps 2 of the task's 5 ")
        assert "raise max_prompt_len or give the task at least 4 training prompts." in msg
    else:
        assert msg.startswith("config.task has 3 training prompts, fewer than the 4 processes")
        assert msg.endswith("give the task at least 4 training prompts.")
    assert runners == []


def test_rows_per_call_over_processes_fails_before_the_build(tmp_path, monkeypatch, runners):
    # A ValueError after the model build, with the reward pool left running.
    _processes(monkeypatch, 2)
    monkeypatch.setattr(build, "build_model", lambda *a: pytest.fail("model built"))
    cfg = tiny_config(str(tmp_path))  # 4 prompts x G = 4: 2 prompts per process
    cfg.sampling.rows_per_call = 4  # 1 prompt per call: half a prompt per process
    with pytest.raises(ConfigError) as e:
        Trainer(cfg, task=_task(train=[3, 4, 5, 6], held_out=[4]))
    assert str(e.value) == (
        "config.sampling.rows_per_call=4 gives 1 prompts per call, which does not split "
        "evenly over 2 processes of 2 prompts each; use a multiple of 8 that divides 16."
    )
    assert runners == []
