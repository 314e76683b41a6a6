"""bench_top_k on its quick size: both forms select the same, in the forms it names."""

from __future__ import annotations

import pytest

from benchmarks import bench_top_k


def test_bench_top_k_quick_run() -> None:
    res = bench_top_k.run(quick=True)
    rows = {(r["vocab"], r["k"]): r for r in res["results"]}
    assert set(rows) == {(v, k) for v in (2048, 16384) for k in (50, 64)}
    # Widths by hand: 2 sqrt(2048 / 50) = 12.8 and 2 sqrt(2048 / 64) = 11.3 -> 8;
    # 2 sqrt(16384 / 50) = 36.2 and 2 sqrt(16384 / 64) = 32 -> 32.
    assert {key: r["width"] for key, r in rows.items()} == {
        (2048, 50): 8,
        (2048, 64): 8,
        (16384, 50): 32,
        (16384, 64): 32,
    }
    for (v, _), r in rows.items():
        assert r["same"] is True, r
        assert r["chosen"] == ("blocks" if v >= 16384 else "top_k")
        assert r["blocks_ms"] > 0 and r["top_k_ms"] > 0
    # The sampling rows: one per mode, from two processes that chose the same tokens
    # (the blocks select exactly what one TopK does).
    assert [(r["vocab"], r["mode"]) for r in res["sampling"]] == [
        (16384, m) for m in bench_top_k.SAMPLE_MODES
    ]
    for r in res["sampling"]:
        assert r["same_tokens"] == 1.0 and r["blocks_ms"] > 0 and r["one_top_k_ms"] > 0, r
        assert r["top_k_calls"] == [2, 1], r  # the second process took one TopK
    table = bench_top_k.format_table(res)
    assert "| 16,384 | 50 | 32 |" in table and "| 16,384 | peaked | top-k 50 |" in table


def test_sampling_rows_refuse_cases_out_of_step() -> None:
    a = [{"vocab": 1, "logits": "flat", "mode": "top-k 50", "ms": 1.0, "tokens": [1, 2]}]
    a[0]["top_k_calls"] = 2
    b = [{**a[0], "mode": "top-p 0.95"}]
    with pytest.raises(AssertionError):
        bench_top_k.sampling_rows(a, b)
    row = bench_top_k.sampling_rows(a, [{**a[0], "ms": 3.0, "tokens": [1, 5]}])[0]
    assert row["speedup"] == 3.0 and row["same_tokens"] == 0.5
