"""Decode-waste counts of the long-tail benchmark, against hand-worked schedules."""

from __future__ import annotations

import numpy as np

from benchmarks.bench_longtail import (
    continuous_decode_steps,
    kv_slot_reads,
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


def test_kv_slot_reads_by_hand():
    """Cap 64: the Sampler's 2 phases of 32 (cache extents 32 and 64, prompt 0)."""
    lengths = np.array([40, 2, 2])
    got = kv_slot_reads(lengths, 2, 0, 64)
    # Static: call [40, 2] reads 2 rows x 32 for 32 steps, then 2 x 64 for 8; call [2]
    # reads 1 x 32 for 2 steps.
    assert got["static"] == 32 * 2 * 32 + 8 * 2 * 64 + 2 * 32
    # Continuous, 2 lanes: 32 steps at extent 32 (rows 1 then 2 beside row 0), then
    # row 0 reaches 32 and both lanes read 64 for its last 8 steps.
    assert got["continuous"] == 32 * 2 * 32 + 8 * 2 * 64
    # What the rows need: row 0 reads 1, 2, ..., 40 slots; rows 1 and 2 read 1 and 2.
    assert got["ragged"] == 40 * 41 // 2 + 3 + 3
    # A prompt adds its P slots to every read (P x rows x steps; needed: P per token).
    with_p = kv_slot_reads(lengths, 2, 5, 64)
    assert with_p["ragged"] == got["ragged"] + 5 * 44
    assert with_p["continuous"] == got["continuous"] + 5 * 2 * 40


def test_kv_slot_reads_with_shared_prompts_by_hand():
    """Rows 0, 1 of prompt 0 and rows 2, 3 of prompt 1 (group 2), prompt 5 slots, cap 64."""
    got = kv_slot_reads(np.array([40, 2, 2, 2]), 2, 5, 64, group=2)
    # Static: call [0, 1] runs 40 steps, one prompt read per step, each row its own
    # 32 slots for 32 steps then 64 for 8; call [2, 3]: 2 steps, one prompt, 32 each.
    assert got["static"] == 40 * 5 + 2 * (32 * 32 + 8 * 64) + 2 * 5 + 2 * 2 * 32
    # Continuous: lane 1 runs rows 1, 2, 3 (2 steps each) beside row 0; every lane
    # copies its prompt: 32 steps x 2 lanes x (5 + 32), then 8 x 2 x (5 + 64).
    assert got["continuous"] == 32 * 2 * 37 + 8 * 2 * 69
    # Shared: the same 40 steps (suggested_prompt_slots(2, 2) = 2: prompt 1 never
    # waits); both slots' 5 prompt slots read at every step, each lane its own.
    assert got["continuous_shared_steps"] == got["continuous_steps"] == 40
    assert got["continuous_shared"] == 40 * 2 * 5 + 32 * 2 * 32 + 8 * 2 * 64
    # Needed: live prompts per step {0} x 2, {0, 1} x 4, {0} x 34 steps.
    prompt = 5 * (2 * 1 + 4 * 2 + 34 * 1)
    assert got["ragged"] == prompt + 40 * 41 // 2 + 3 * 3


def test_longtail_lengths_are_capped_and_skewed():
    x = longtail_lengths(4096, median=24, sigma=1.0, cap=512, seed=0)
    assert x.min() >= 1 and x.max() <= 512 and abs(np.median(x) - 24) <= 2
    assert x.mean() > np.median(x)  # long right tail


def test_shared_prompt_slots_schedule_by_hand():
    """4 lanes, 3 prompts x 4 rows, 2 prompt slots (the schedule is worked step
    by step in test_continuous_shared.py): copies 6 steps, shared
    7 (prompt 2's rows wait 2 steps for a slot). Prompt 3 slots, cap 64 (one
    phase of 32 own slots reached): copies read 6 x 4 x (3 + 32); shared 7 x
    (2 slots x 3 + 4 x 32)."""
    lengths = np.array([5, 1, 1, 1, 5, 1, 1, 1, 1, 1, 1, 1])
    got = kv_slot_reads(lengths, 4, 3, 64, group=4, prompt_slots_per_shard=2)
    assert (got["continuous_steps"], got["continuous_shared_steps"]) == (6, 7)
    assert got["continuous"] == 6 * 4 * 35
    assert got["continuous_shared"] == 7 * (2 * 3 + 4 * 32)
    # suggested_prompt_slots(4, 4) = 3 slots: prompt 2 starts at once (6 steps).
    auto = kv_slot_reads(lengths, 4, 3, 64, group=4)
    assert auto["continuous_shared_steps"] == 6 and auto["continuous_shared"] == 6 * (9 + 128)
