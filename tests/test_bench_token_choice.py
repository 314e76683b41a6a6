"""bench_token_choice on its quick size: both forms run and choose the same tokens."""

from __future__ import annotations

from benchmarks import bench_token_choice


def test_bench_token_choice_matches_the_replaced_forms() -> None:
    res = bench_token_choice.run(quick=True)
    got = {(r["logits"], r["mode"]) for r in res["results"]}
    assert got == {(s, m) for s in bench_token_choice.SHAPES for m in bench_token_choice.MODES}
    for r in res["results"]:
        assert r["vocab"] == 2048 and r["ours_ms"] > 0 and r["reference_ms"] > 0
        # The two-level inverse CDF, the candidate nucleus and the unsliced top-k pick
        # the tokens the cumsum, the 32-step bisection and the sliced top-k did (one
        # row of 64 may differ on another CPU: f32 rounding of the sums at a boundary).
        assert r["same_tokens"] >= 1 - 1 / bench_token_choice.ROWS, r
    table = bench_token_choice.format_table(res)
    assert "| 2048 | peaked | top-p 0.95 |" in table
