"""benchmarks/probe_bisect_chunks.py on its quick size: both forms compile as asked and
choose the same tokens."""

from __future__ import annotations

from benchmarks import probe_bisect_chunks as probe
from gdpo_jax.sampling import filters


def test_quick_run_compiles_both_forms_and_restores_the_library() -> None:
    res = probe.run(quick=True)
    (row,) = res["results"]
    assert (row["vocab"], row["logits"]) == (2048, "mixed")
    assert row["same_tokens"] == 1.0 and row["chunks_1_8_ms"] > 0 and row["chunks_8_ms"] > 0
    # One bisection loop per chunk size: the form before has three fewer.
    now, before = row["loops"]
    assert now - before == len(filters.BISECT_CHUNKS) - 1, row["loops"]
    assert filters.BISECT_CHUNKS == (1, 2, 4, filters.BISECT_ROWS)  # restored
    assert "| 2048 | mixed |" in probe.format_table(res)
