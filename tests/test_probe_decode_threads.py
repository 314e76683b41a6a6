"""benchmarks/probe_decode_threads.py: the decode's products, their check against
NumPy, the one-core process really on one core, and the tables."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import probe_decode_threads as probe
from benchmarks.bench_sampler import HF_CONFIG
from tests._bench_run import run_quick


def test_the_products_are_the_fused_decodes_by_hand():
    # bench_sampler's model: hidden 256, 4 heads and 2 kv heads of 64, MLP 768, vocab 2048.
    assert probe.decode_products(HF_CONFIG) == [
        ("q/k/v (fused)", 64, 256, 4 * 64 + 2 * 2 * 64),
        ("o projection", 64, 4 * 64, 256),
        ("gate/up (fused)", 64, 256, 2 * 768),
        ("down projection", 64, 768, 256),
        ("unembedding", 64, 256, 2048),
    ]


def test_each_timed_program_computes_its_products():
    # The chained loop's sum and the independent products equal NumPy's (f64), so the
    # timed programs do the work the table names (none hoisted or dropped).
    rows = probe._products(repeats=1)
    assert [r["product"] for r in rows] == [p[0] for p in probe.decode_products(HF_CONFIG)]
    for r in rows:
        assert r["ms"] > 0 and r["max_rel_diff"] < 1e-5, r
    ind = probe._independent(repeats=1)
    assert ind["count"] == probe.INDEPENDENT and ind["max_rel_diff"] < 1e-5
    assert ind["side_by_side_ms"] > 0 and ind["chained_ms"] > 0


@pytest.mark.slow
def test_quick_run_times_every_core_and_one(tmp_path):
    res = run_quick("probe_decode_threads", tmp_path)
    assert res["one_core_process_cores"] == 1 and res["cores"] >= 1
    for r in res["rows"]:
        assert r["max_rel_diff"] < 1e-5
        want = round(r["ms_one_core"] / r["ms_all_cores"], 2)
        assert r["second_core_speedup"] == want
        m, k, n = r["m_k_n"]
        assert np.isclose(r["gflops_all_cores"], 2 * m * k * n / r["ms_all_cores"] / 1e6, rtol=0.01)
    table = probe.table_markdown(res)
    # Rows after the first header: the products, then the second table's header and row.
    assert table.count("\n| ") == len(res["rows"]) + (2 if res["independent"] else 0)
