"""bench_prompt_sharing --quick end to end: both sides give the same log-probs, each
compiles once, the ideal ratio is the token count's, and the table prints."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_kernel_run_checks_every_cpu_kernel_against_f32(monkeypatch):
    """--model smollm2 --quick on CPU: the tiny model in bf16 through each CPU kernel
    ("xla", "dpa"), both sides near the f32 per-row reference and near each other."""
    monkeypatch.setitem(bench.QUICK, "widths", (16,))
    res = bench.run(quick=True, model="smollm2")
    rows = res["results"]
    assert [r["attention"] for r in rows] == list(bench.KERNELS["cpu"])
    for r in rows:
        assert r["dtype"] == "bfloat16" and r["compiles"] == [1, 1]
        assert r["logp_std_f32"] > 0.5  # far from uniform: a wrong key would show
        # bf16 rounding, not a wrong mask (which would move log-probs by O(1))
        assert 0 < r["max_dlogp_vs_f32_per_row"] < 0.1
        assert 0 < r["max_dlogp_vs_f32_shared"] < 0.1
        assert r["max_abs_logp_diff"] < 0.1
        assert abs(r["loss_per_row"] - r["loss_shared"]) < 0.05 * abs(r["loss_per_row"])
    md = bench.table_markdown(res)
    assert md.count("\n") == 1 + len(rows) and "| dpa |" in md
    assert "attention" in bench.format_table(res)


def test_kernel_run_overrides_and_rejects_a_kernel_the_backend_lacks():
    res = bench.run(quick=True, model="smollm2", attention=("dpa",), microbatches=1, widths=(8,))
    assert [(r["prompt_width"], r["attention"]) for r in res["results"]] == [(8, "dpa")]
    assert res["config"]["microbatches"] == 1 and "1 micro-batches" in bench.format_table(res)
    with pytest.raises(ValueError, match=r"--attention cudnn: this backend \(cpu\) offers"):
        bench.run(quick=True, model="smollm2", attention=("cudnn",))
