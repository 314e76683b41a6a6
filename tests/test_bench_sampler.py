"""bench_sampler end to end on a shrunken batch: both sides run, the table renders."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks import bench_sampler  # noqa: E402


def test_bench_sampler_runs_both_sides_and_greedy_rows_match_transformers(monkeypatch) -> None:
    # 2 prompts x 2 generations, 8-token prompts, 8 new tokens (quick halves it to 4).
    monkeypatch.setitem(bench_sampler.MODELS, "tiny", (bench_sampler.HF_CONFIG, 2, 2, 8, 8))
    res = bench_sampler.run(quick=True, model_name="tiny")
    assert res["hf_device"] == "cpu" and res["model_name"] == "tiny"
    assert [r["mode"] for r in res["results"]] == ["greedy", "sampled", "top-k 50"]
    for r in res["results"]:
        assert r["rows"] == 4 and r["new_tokens"] == 4
        assert r["ours_s"] > 0 and r["hf_s"] > 0 and r["hf_1_thread_s"] is not None
    # Same checkpoint, same f32 maths on CPU: every greedy row is transformers' row.
    assert res["greedy_rows_identical_to_hf"] == 1.0
    table = bench_sampler.format_table(res)
    assert "tiny model; cpu; torch" in table and "greedy rows identical to HF: 100%" in table
