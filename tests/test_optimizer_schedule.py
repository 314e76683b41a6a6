"""The learning-rate schedule (`optim.*`): warmup from 0, then constant / cosine / linear
decay, against hand-worked values; a warmup as long as the run is said out loud."""

from __future__ import annotations

import logging
import math

import pytest

from gdpo_jax.train import state as state_lib
from gdpo_jax.train.schema import base_config


def _optim(**kw):
    optim = base_config().optim
    optim.update(dict(lr=1.0, min_lr_ratio=0.0, **kw))
    return optim


@pytest.mark.parametrize(
    "schedule, expected",
    [
        # 2 warmup updates (0, 0.5), then 4 decay updates from lr=1 to 0 over 4 steps.
        ("constant", [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]),
        ("linear", [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]),
        ("cosine", [0.0, 0.5] + [0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)]),
    ],
)
def test_schedule_matches_hand_worked_values(schedule, expected):
    _, sched = state_lib.make_optimizer(_optim(schedule=schedule, warmup_steps=2), total_updates=6)
    assert [float(sched(t)) for t in range(6)] == pytest.approx(expected, abs=1e-6)


def test_warmup_in_rl_steps_counts_every_update_of_a_step():
    # 1 warmup RL step of 2 updates: updates 0 and 1 warm up.
    _, sched = state_lib.make_optimizer(
        _optim(schedule="constant", warmup_steps=1), total_updates=8, updates_per_step=2
    )
    assert [float(sched(t)) for t in range(3)] == pytest.approx([0.0, 0.5, 1.0])


@pytest.mark.parametrize("warmup, warned", [(3, False), (4, True), (9, True), (0, False)])
def test_a_warmup_as_long_as_the_run_is_warned_about(caplog, warmup, warned):
    # A run whose warmup covers all its steps never trained at optim.lr, without a word.
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.train"):
        state_lib.make_optimizer(
            _optim(schedule="cosine", warmup_steps=warmup), total_updates=8, updates_per_step=2
        )
    text = caplog.text
    assert ("never reaches optim.lr=1" in text) is warned
    if warned:
        last = 7 / (2 * warmup)  # update 7 of a 2*warmup-update ramp from 0 to 1
        assert f"optim.warmup_steps={warmup} is not below the run's 4 steps" in text
        assert f"its last update uses {last:.3g}" in text
