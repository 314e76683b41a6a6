"""Decode-waste counts of the long-tail benchmark, against hand-worked schedules."""

from __future__ import annotations

import numpy as np

from benchmarks.bench_longtail import (
    continuous_decode_steps,
    longtail_lengths,
    static_decode_steps,
    waste_table,
)


def test_static_and_continuous_steps_by_hand():
    lengths = np.array([8, 1, 1, 1, 1, 1, 1, 1])
    # Static calls of 2 rows: [8,1] [1,1] [1,1] [1,1] -> 8 + 1 + 1 + 1 steps.
    assert static_decode_steps(lengths, 2) == 11
    # 2 slots: one runs the 8-token row, the other the seven 1-token rows.
    assert continuous_decode_steps(lengths, 2) == 8
    t = waste_table(lengths, 2)
    assert t["useful_tokens"] == 15 and t["static_decoded_tokens"] == 22
    assert t["continuous_decoded_tokens"] == 16 and t["useful_throughput_gain"] == 1.38
    # No tail, no gain: equal lengths fill every slot in both schedules.
    assert continuous_decode_steps(np.full(8, 5), 4) == static_decode_steps(np.full(8, 5), 4) == 10


def test_longtail_lengths_are_capped_and_skewed():
    x = longtail_lengths(4096, median=24, sigma=1.0, cap=512, seed=0)
    assert x.min() >= 1 and x.max() <= 512 and abs(np.median(x) - 24) <= 2
    assert x.mean() > np.median(x)  # long right tail
