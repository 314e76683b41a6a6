"""bench_prompt_slots at a tiny size: every W's rows equal the copies', its step
and read counts are the schedule's, and the table renders them."""

from __future__ import annotations

import numpy as np

from benchmarks import bench_prompt_slots
from benchmarks.bench_longtail import kv_slot_reads, longtail_lengths


def test_prompt_slots_bench_runs_and_counts_the_schedule():
    res = bench_prompt_slots.run(prompt_len=8, group=4, prompt_slots=(2, 3), repeats=1, size=(4, 8))
    assert [r["prompt_slots"] for r in res["runs"]] == [0, 2, 3]
    assert res["rows"] == 32 and res["useful_tokens"] > 0 and res["fixed_s"] > 0
    lengths = longtail_lengths(32, median=24.0, sigma=1.0, cap=8)
    assert res["useful_tokens"] == int(lengths.sum())
    for r in res["runs"]:
        assert r["greedy_rows_identical"]
        reads = kv_slot_reads(lengths, 4, 8, 8, group=4, prompt_slots_per_shard=r["prompt_slots"])
        kind = "continuous_shared" if r["prompt_slots"] else "continuous"
        # The Sampler's decode steps are the counted schedule's (rows wait for slots).
        assert r["decode_steps"] == reads[f"{kind}_steps"]
        # The wiring (group, slots) of the counted reads; kv_slot_reads itself is
        # checked on hand-worked schedules in test_bench_longtail.
        assert r["kv_slot_reads"] == reads[kind]
    # Two slots for 4 lanes of one prompt each can make rows wait: never fewer steps
    # than the copies (here as many: nearly every row runs to the cap).
    steps = [r["decode_steps"] for r in res["runs"]]
    assert steps[1] >= steps[0] and np.isfinite(res["runs"][1]["best_s"])
    table = bench_prompt_slots.table_markdown(res)
    assert "| 0 (copies) |" in table and "| 2 |" in table and "32 rows x 4 lanes, cap 8" in table
