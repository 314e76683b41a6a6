"""bench_top_k on its quick size: both forms select the same, in the forms it names."""

from __future__ import annotations

from benchmarks import bench_top_k
from gdpo_jax.sampling import topk


def test_bench_top_k_quick_run() -> None:
    least = topk.BLOCKS_MIN_VOCAB
    res = bench_top_k.run(quick=True)
    assert topk.BLOCKS_MIN_VOCAB == least  # restored after the form before
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
    # The sampling rows: one per mode; both forms chose the same tokens (the blocks
    # select exactly what one TopK does).
    assert [(r["vocab"], r["mode"]) for r in res["sampling"]] == [
        (16384, m) for m in bench_top_k.SAMPLE_MODES
    ]
    for r in res["sampling"]:
        assert r["same_tokens"] == 1.0 and r["blocks_ms"] > 0 and r["one_top_k_ms"] > 0, r
        assert r["top_k_calls"] == [2, 1], r  # the form before took one TopK
    table = bench_top_k.format_table(res)
    assert "| 16,384 | 50 | 32 |" in table and "| 16,384 | peaked | top-k 50 |" in table
