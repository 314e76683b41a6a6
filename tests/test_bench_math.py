"""bench_math --quick end to end: math-verify's verdict on every kind of answer pair is
the hand-worked one, the pathological answer times out and the next comparison still
works, and math_correct scores the batch as expected (the run raises otherwise)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from benchmarks import bench_math


@pytest.mark.parametrize("k", [2, 3, 7, 10])
def test_numeric_kinds_verdicts_hold_in_exact_arithmetic(k: int) -> None:
    """The hand-worked verdicts of the purely numeric kinds, checked with Fractions
    (independent of math-verify and sympy)."""
    dec, frac, want = bench_math.PAIRS["decimal vs fraction"](k)
    assert (
        want == (Fraction(dec) == Fraction(2 * k + 1, 2)) and frac == f"\\frac{{{2 * k + 1}}}{{2}}"
    )
    pct, dec, want = bench_math.PAIRS["percent"](k)
    assert want == (Fraction(k, 100) == Fraction(dec))
    a, b, want = bench_math.PAIRS["wrong integer"](k)
    assert want == (int(a) == int(b))
    _, rounded, want = bench_math.PAIRS["rounded fraction"](k)
    assert want == (Fraction(3 * k + 1, 3) == Fraction(rounded))


def test_bench_math_quick_checks_verdicts_timeout_and_scores() -> None:
    res = bench_math.run(quick=True)
    rows = res["comparisons"]
    assert [r["kind"] for r in rows] == list(bench_math.PAIRS)
    assert [r["path"] for r in rows].count("string") == 1 and rows[0]["path"] == "string"
    assert all(0 <= r["median_ms"] <= r["max_ms"] for r in rows)
    p = res["pathological"]
    assert p["timed_out"] and p["next_ok"] and p["to_timeout_s"] >= p["deadline_s"]
    assert [(r["workers"], r["completions"]) for r in res["reward"]] == [(1, 12), (2, 12)]
    assert res["helper_start"]["median_s"] > 0
    table = bench_math.format_table(res)
    assert table.count("| kind |") == 1 and table.count("| workers |") == 1
