"""bench_sandbox --quick end to end: every mode the machine allows is timed, the code
reward scores the right and wrong programs (the run raises otherwise), tables render."""

from __future__ import annotations

from benchmarks import bench_sandbox


def test_bench_sandbox_quick_times_every_mode_and_checks_scores() -> None:
    modes = bench_sandbox.available_modes()
    res = bench_sandbox.run(quick=True)
    rows = res["programs"]
    assert [(r["mode"], r["program"]) for r in rows] == [(m, "plain") for m in modes] + [
        (modes[0], "all preloads")
    ]
    for r in rows:
        assert 0 < r["program_1_case_ms"] and 0 < r["program_8_cases_ms"]
    assert 0 < res["bare_interpreter_ms"]["no_site"] and 0 < res["bare_interpreter_ms"]["site"]
    assert [(r["mode"], r["workers"], r["completions"]) for r in res["reward"]] == [
        (modes[0], 1, 8),
        (modes[0], 2, 8),
    ]
    table = bench_sandbox.format_table(res)
    assert table.count("| mode |") == 2 and "all preloads" in table
