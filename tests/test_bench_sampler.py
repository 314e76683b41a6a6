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


def test_every_mode_reads_its_own_calls_times_from_one_set_of_rounds(monkeypatch) -> None:
    # All modes of both sides are timed in the same rounds (two calls a turn, the second
    # timed): one time_interleaved call whose i-th time belongs to the i-th function, in
    # the order mode by mode: ours, transformers at default threads, single-threaded.
    from benchmarks import common

    monkeypatch.setitem(bench_sampler.MODELS, "tiny", (bench_sampler.HF_CONFIG, 2, 2, 8, 8))
    calls = []

    def fake(fns, *, repeats, warmup=0, calls_per_turn=1):
        calls.append((len(fns), repeats, warmup, calls_per_turn))
        for fn in fns:
            fn()
        return [
            {"best_s": i + 1.0, "median_s": i + 1.5, "first_best_s": i + 10.0}
            for i in range(len(fns))
        ]

    monkeypatch.setattr(common, "time_interleaved", fake)
    res = bench_sampler.run(quick=True, model_name="tiny")
    assert calls == [(9, 3, 0, 2)] and res["timing"].startswith("rounds, 2 calls a turn")
    for k, r in enumerate(res["results"]):
        ours, hf_n, hf_1 = 3 * k + 1, 3 * k + 2, 3 * k + 3
        assert (r["ours_s"], r["hf_default_threads_s"], r["hf_1_thread_s"]) == (ours, hf_n, hf_1)
        assert r["hf_s"] == hf_n and r["speedup"] == round(hf_n / ours, 2)
        assert r["ours_median_s"] == ours + 0.5
        assert (r["ours_first_s"], r["hf_first_s"]) == (ours + 9, hf_n + 9)
