"""bench_prompt_sharing --quick end to end: both sides give the same log-probs, each
compiles once, the ideal ratio is the token count's, and the table prints."""

from __future__ import annotations

import numpy as np

from benchmarks import bench_prompt_sharing as bench


def test_make_batch_groups_share_one_left_padded_prompt():
    b = bench.make_batch(bench.QUICK, 8, seed=1)
    g = bench.QUICK["group"]
    ids = b["prompt_ids"].reshape(-1, g, 8)
    assert (ids == ids[:, :1]).all()
    m = b["prompt_mask"]
    assert (m[:, -1] == 1).all() and (np.diff(m, axis=1) >= 0).all()  # left padded
    assert (m.sum(1) >= 4).all()


def test_quick_run_agrees_and_reports_every_width():
    res = bench.run(quick=True)
    rows = res["results"]
    assert [r["prompt_width"] for r in rows] == list(bench.QUICK["widths"])
    C, G = bench.QUICK["new_tokens"], bench.QUICK["group"]
    for r in rows:
        P = r["prompt_width"]
        assert r["ideal_speedup"] == round((P + C) / (P / G + C), 3)
        assert r["max_abs_logp_diff"] < 1e-5
        assert r["compiles"] == [1, 1]
        assert r["step_s_per_row"] > 0 and r["step_s_shared"] > 0
    table = bench.format_table(res)
    assert "ideal_speedup" in table and str(rows[-1]["prompt_width"]) in table
