"""benchmarks/common.py helpers and the benchmarks/run_all.py entry point.

run_all is exercised on throw-away benchmark modules (one that works, one that
raises, one that does not exist), inline and in child processes.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import shlex
import sys
import time

import numpy as np
import pytest

from benchmarks import common, run_all, summary

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_markdown_table_hand_written():
    rows = [{"name": "a", "ms": 1.23456, "n": 65536}, {"name": "b|c", "ms": 0.0001}]
    want = "| name | ms | n |\n|---|---|---|\n| a | 1.235 | 65,536 |\n| b\\|c | 1.000e-04 |  |"
    assert common.markdown_table(rows) == want
    assert common.markdown_table([]) == "_(no rows)_"


def test_other_ends_names_each_end_but_finished_once():
    assert common.other_ends(["finished", "aborted", "hung", "aborted"]) == "aborted, hung"
    assert common.other_ends(["finished", "finished"]) == "-"
    assert common.other_ends([]) == "-"


def test_text_table_aligns_columns():
    out = common.text_table([{"x": 1, "long name": "v"}, {"x": 100}]).splitlines()
    assert len({len(line) for line in out}) == 1, out  # every line the same width
    assert out[0].split() == ["x", "long", "name"]


@pytest.mark.parametrize(
    "value, text",
    [
        (True, "True"),
        (None, ""),
        (3, "3"),
        (12345, "12,345"),
        (0.5, "0.5"),
        (123456.0, "123,456"),
        (9999.7, "10,000"),  # 4 digits round it up: was "1e+04"
        (2e9, "2.000e+09"),
        (float("nan"), "nan"),
        ([1, 2.5], "1, 2.5"),
    ],
)
def test_format_value(value, text):
    assert common.format_value(value) == text


def test_to_jsonable_and_write_json(tmp_path):
    obj = {
        "a": np.float32(1.5),
        "b": np.arange(3),
        "c": (1, float("nan")),
        4: np.int64(7),
        "d": float("inf"),
        "e": object,
    }
    path = common.write_json(str(tmp_path / "sub" / "x.json"), obj)
    got = json.loads(pathlib.Path(path).read_text())
    assert got["a"] == 1.5 and got["b"] == [0, 1, 2] and got["c"] == [1, None]
    assert got["4"] == 7 and got["d"] is None and got["e"].startswith("<class")
    assert not list(tmp_path.glob("sub/*.tmp"))  # the temp file was moved into place


def test_result_to_markdown_renders_lists_of_dicts_as_tables():
    md = common.result_to_markdown({"N": 4, "results": [{"k": 1}, {"k": 2}], "sub": {"x": 1.0}})
    assert "| N | 4 |" in md and "**results**" in md and "| 1 |\n| 2 |" in md
    assert "**sub**" in md and "| x | 1 |" in md


def test_machine_info_fields():
    info = common.machine_info()
    for key in ("cpu_model", "cpu_count", "memory_gib", "backend", "device_kind", "versions"):
        assert key in info, key
    assert info["versions"]["jax"] and info["backend"] == "cpu"
    assert "cores" in common.describe_machine(info)


def test_matmul_peak_is_consistent():
    peak = common.matmul_peak(128, repeats=2)
    assert peak["n"] == 128 and peak["dtype"] == "float32"
    # FLOP/s is 2 n^3 over the best per-matmul time (independent arithmetic).
    assert math.isclose(peak["flops_per_s"], 2 * 128**3 / peak["best_s"], rel_tol=1e-9)
    assert peak["flops_per_s"] > 1e6
    with pytest.raises(ValueError, match="repeats"):
        common.time_fn(lambda: None, repeats=0)


@pytest.fixture()
def fake_benchmarks(tmp_path, monkeypatch):
    pkg = tmp_path / "nbh_fakebench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ok.py").write_text(
        "import numpy as np\n"
        "def run(quick: bool = False):\n"
        "    print('hello from ok')\n"
        "    return {'quick': quick, 'value': np.float32(2.0), 'results': [{'a': 1}]}\n"
    )
    (pkg / "boom.py").write_text("def run(quick=False):\n    raise RuntimeError('kaboom')\n")
    (pkg / "norun.py").write_text("X = 1\n")
    path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)  # the child processes import from here
    monkeypatch.syspath_prepend(str(tmp_path))
    return ["nbh_fakebench.ok", "nbh_fakebench.boom", "nbh_fakebench.norun", "bench_missing_xyz"]


@pytest.mark.parametrize("isolate", [False, True], ids=["inline", "isolated"])
def test_run_all_records_ok_error_and_missing(fake_benchmarks, isolate, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    report = run_all.run_benchmarks(
        fake_benchmarks, quick=True, isolate=isolate, measure_peak=False
    )
    b = report["benchmarks"]
    assert b["nbh_fakebench.ok"]["status"] == "ok"
    assert b["nbh_fakebench.ok"]["result"] == {"quick": True, "value": 2.0, "results": [{"a": 1}]}
    assert b["nbh_fakebench.boom"]["status"] == "error"
    assert "RuntimeError: kaboom" in b["nbh_fakebench.boom"]["error"]
    assert "kaboom" in b["nbh_fakebench.boom"]["traceback"]
    assert b["nbh_fakebench.norun"]["status"] == "error"
    assert "no run(quick" in b["nbh_fakebench.norun"]["error"]
    assert b["bench_missing_xyz"]["status"] == "missing"
    assert report["machine"]["cpu_count"] >= 1

    js, md = run_all.write_report(report, str(tmp_path / "bench"))
    assert (
        json.loads(pathlib.Path(js).read_text())["benchmarks"]["bench_missing_xyz"]["status"]
        == "missing"
    )
    text = pathlib.Path(md).read_text()
    assert "| nbh_fakebench.boom | error |" in text and "## nbh_fakebench.ok" in text
    assert len(list((tmp_path / "bench" / "history").glob("bench-*.json"))) == 1


def test_run_all_main_writes_latest_with_peak(fake_benchmarks, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "out"
    rc = run_all.main(
        [
            "--quick",
            "--out_dir",
            str(out),  # isolated: peak in a child too
            "--only",
            "nbh_fakebench.ok",
        ]
    )
    assert rc == 0
    report = json.loads((out / "latest.json").read_text())
    assert report["matmul_peak"]["flops_per_s"] > 0
    assert "Measured matmul peak" in (out / "latest.md").read_text()
    assert (
        run_all.main(["--no_isolate", "--out_dir", str(out), "--only", "nbh_fakebench.boom"]) == 1
    )
    # A name that is no benchmark, or an output dir that is a file: one line, before any work.
    (tmp_path / "afile").write_text("")
    for args, msg in (
        (["--only", "bench_missing_xyz"], "--only: no benchmark ['bench_missing_xyz']"),
        (["--out_dir", str(tmp_path / "afile")], "is a file, not a directory"),
        (["--timeout_s", "-5"], "--timeout_s=-5.0 must be >= 0"),
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            run_all.main(args)
        assert e.value.code == 2 and msg in capsys.readouterr().err


# ---------------------------------------------------------- one table per machine kind
MATMUL = {"step": 0.75, "decode": 1.25}  # bench_matmul's family ratios, hand-set


def _fake_report(
    cpu: str, cores: int, iter0: float, sampler_greedy: float, top_k: bool = True
) -> dict:
    """A full-run report shaped like run_all's, with hand-set ratios (top_k: whether
    bench_sampler had its top-k mode and bench_matmul ran, which older runs lack)."""
    top = [{"mode": "top-k 50", "speedup": sampler_greedy + 1.0}] if top_k else []
    rl = {
        f"beta={b}": {"speedup_iter": iter0 + d, "speedup_step": 1.0 + d}
        for b, d in (("0.0", 0.0), ("0.04", 0.1))
    }
    return {
        "created": "2026-11-23T08:00:00Z",
        "command": "python -m benchmarks.run_all",
        "quick": False,
        "machine": {"cpu_model": cpu, "cpu_usable": cores, "backend": "cpu"},
        "benchmarks": {
            "bench_rl": {"status": "ok", "result": {"results": rl}},
            "bench_sampler": {
                "status": "ok",
                "result": {
                    "results": [
                        {"mode": "greedy", "speedup": sampler_greedy},
                        {"mode": "sampled", "speedup": sampler_greedy + 0.5},
                    ]
                    + top
                },
            },
            "bench_advantages": {"status": "error", "error": "boom"},
        }
        | ({"bench_matmul": {"status": "ok", "result": {"families": MATMUL}}} if top_k else {}),
    }


def test_machine_kind_slugs():
    assert common.machine_kind({"cpu_model": "AMD EPYC", "cpu_usable": 2}) == "amd-epyc-2c"
    xeon = {"cpu_model": "Intel(R) Xeon(R) CPU @ 2.20GHz", "cpu_usable": 2, "backend": "cpu"}
    assert common.machine_kind(xeon) == "intel-xeon-2c"
    assert common.machine_kind(dict(xeon, cpu_isa="avx512")) == "intel-xeon-avx512-2c"
    gpu = dict(xeon, backend="gpu", device_kind="NVIDIA H100", device_count=1)
    assert common.machine_kind(gpu) == "intel-xeon-2c-gpu-nvidia-h100-x1"


def test_cpu_details_read_clock_cache_and_amx(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\ncpu MHz\t\t: 2600.000\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n"
        "processor\t: 1\ncpu MHz\t\t: 1200.000\nflags\t\t: fpu avx512f\n"
    )
    (tmp_path / "cpu0" / "cache" / "index3").mkdir(parents=True)
    (tmp_path / "cpu0" / "cache" / "index3" / "size").write_text("491520K\n")
    got = common._cpu_details(str(cpuinfo), str(tmp_path))
    assert got == {"mhz": 2600.0, "l3_cache": "491520K", "amx": True}  # the first CPU's
    cpuinfo.write_text("flags\t\t: fpu avx2\n")
    got = common._cpu_details(str(cpuinfo), str(tmp_path / "none"))
    assert got == {"mhz": None, "l3_cache": None, "amx": False}
    assert set(common._cpu_details()) == {"mhz", "l3_cache", "amx"}  # this machine's


def test_summary_has_one_row_per_machine_kind_and_the_ranges(tmp_path, monkeypatch):
    monkeypatch.setattr(run_all, "report_to_markdown", lambda r: "stub")
    out = tmp_path / "bench"
    run_all.write_report(_fake_report("AMD EPYC", 2, 1.7, 2.1), str(out))
    xeon = _fake_report("Intel(R) Xeon(R) CPU @ 2.20GHz", 2, 0.8, 1.3, top_k=False)
    run_all.write_report(xeon, str(out))
    # A later full run of a kind replaces its row; a quick run never does.
    run_all.write_report(_fake_report("AMD EPYC", 2, 1.5, 2.0), str(out))
    run_all.write_report(dict(_fake_report("AMD EPYC", 2, 9.0, 9.0), quick=True), str(out))
    assert sorted(p.name for p in (out / "machines").glob("*.json")) == [
        "amd-epyc-2c.json",
        "intel-xeon-2c.json",
    ]
    rows = summary.summary_rows(str(out / "machines"))
    assert [r["machine"] for r in rows] == ["amd-epyc-2c", "intel-xeon-2c"]
    assert rows[0]["rl_iter_b0.0"] == 1.5 and rows[1]["rl_iter_b0.04"] == pytest.approx(0.9)
    assert rows[0]["advantages_gdpo"] is None  # the benchmark failed there
    assert summary.ratio_range(rows, "rl_iter_b0.0") == (0.8, 1.5)
    assert summary.ratio_range(rows, "sampler_sampled") == (1.8, 2.5)
    assert summary.ratio_range(rows, "advantages_gdpo") is None
    # A mode one machine's run lacks: its cell is empty, the range counts one machine.
    assert rows[1]["sampler_top_k"] is None
    assert summary.ratio_range(rows, "sampler_top_k") == (3.0, 3.0)
    text = (out / "summary.md").read_text()
    assert "| amd-epyc-2c | AMD EPYC | 2 |" in text
    assert "| RL iteration vs TRL, beta 0 | 0.80x | 1.50x | 2 |" in text
    assert "| sampler vs generate(), top-k 50 | 3.00x | 3.00x | 1 |" in text
    # bench_matmul's families (runs before 2026-11-28 lack it, as the Xeon one here).
    assert rows[1]["matmul_step"] is None and rows[0]["matmul_decode"] == 1.25
    assert "| XLA matmuls vs PyTorch's, step shapes | 0.75x | 0.75x | 1 |" in text


def _full_report() -> dict:
    """A full run_all report of one 2-core AMD EPYC kind, every benchmark ok."""
    full = _fake_report("AMD EPYC", 2, 1.7, 2.1)
    full["benchmarks"] = {n: {"status": "ok", "result": {}} for n in run_all.BENCHMARKS} | full[
        "benchmarks"
    ]
    full["benchmarks"]["bench_advantages"] = {"status": "ok", "result": {}}
    full["machine"] |= dict(cpu_count=2, memory_gib=24, versions={}, device_kind="cpu")
    full["machine"] |= dict(device_count=1)
    return full


def test_a_run_of_some_benchmarks_updates_only_theirs_in_the_machine_file(tmp_path):
    """`run_all --only bench_matmul` (a full run of one benchmark) used to replace the
    kind's machine file with one that held bench_matmul alone: the kind's row lost its
    RL and sampler ratios. It now updates that entry and lists the run."""
    out = tmp_path / "bench"
    full = _full_report()
    run_all.write_report(full, str(out))
    part = dict(full, created="2026-12-03T12:00:00Z")
    part["benchmarks"] = {
        "bench_matmul": {"status": "ok", "result": {"families": {"step": 0.5, "decode": 0.6}}}
    }
    run_all.write_report(part, str(out))
    kept = json.loads((out / "machines" / "amd-epyc-2c.json").read_text())
    assert set(kept["benchmarks"]) == set(run_all.BENCHMARKS)
    assert kept["created"] == full["created"]  # the run the other entries came from
    assert kept["updates"] == [
        {
            "created": "2026-12-03T12:00:00Z",
            "command": part["command"],
            "matmul_peak": None,
            "benchmarks": ["bench_matmul"],
        }
    ]
    row = summary.summary_rows(str(out / "machines"))[0]
    assert row["rl_iter_b0.0"] == 1.7 and row["sampler_greedy"] == 2.1  # kept
    assert row["matmul_step"] == 0.5  # updated
    # The row is dated by both runs: its ratios are not all the full run's.
    assert row["run"] == "2026-11-23 (bench_matmul 2026-12-03)"
    summary_md = (out / "summary.md").read_text()
    assert "| amd-epyc-2c | AMD EPYC | 2 | 2026-11-23 (bench_matmul 2026-12-03) |" in summary_md
    md = (out / "machines" / "amd-epyc-2c.md").read_text()
    assert "Updated 2026-12-03T12:00:00Z: `python -m benchmarks.run_all` (bench_matmul)" in md
    # Updates group by date; one on the full run's own date adds nothing to its date.
    for created, names in (
        ("2026-12-03T13:00:00Z", ["bench_math", "bench_matmul"]),
        ("2026-11-23T23:00:00Z", ["bench_rl"]),
    ):
        later = dict(part, created=created)
        later["benchmarks"] = {n: {"status": "ok", "result": {}} for n in names}
        run_all.write_report(later, str(out))
    row = summary.summary_rows(str(out / "machines"))[0]
    assert row["run"] == "2026-11-23 (bench_matmul, bench_math 2026-12-03)"
    # A later run of every benchmark replaces the file, updates and all.
    run_all.write_report(full, str(out))
    assert "updates" not in json.loads((out / "machines" / "amd-epyc-2c.json").read_text())


def test_a_failed_run_of_some_benchmarks_keeps_their_published_entries(tmp_path):
    """`run_all --only bench_rl,bench_matmul` where bench_rl crashes: the kind keeps its
    published bench_rl entry (its row its RL ratios); only the entry that ran is merged,
    and the update names the one that was not."""
    out = tmp_path / "bench"
    full = _full_report()
    run_all.write_report(full, str(out))
    path = out / "machines" / "amd-epyc-2c.json"
    part = dict(full, created="2026-12-05T12:00:00Z")
    part["benchmarks"] = {
        "bench_rl": {"status": "error", "error": "timed out after 1800 s"},
        "bench_matmul": {"status": "ok", "result": {"families": {"step": 0.5}}},
    }
    run_all.write_report(part, str(out))
    kept = json.loads(path.read_text())
    assert kept["benchmarks"]["bench_rl"] == full["benchmarks"]["bench_rl"]
    assert kept["updates"][-1]["benchmarks"] == ["bench_matmul"]
    assert kept["updates"][-1]["not_merged"] == {"bench_rl": "error"}
    row = summary.summary_rows(str(out / "machines"))[0]
    assert row["rl_iter_b0.0"] == 1.7 and row["matmul_step"] == 0.5
    # A partial run with nothing that ran leaves the file as it was.
    before = path.read_text()
    part["benchmarks"] = {"bench_rl": {"status": "error", "error": "boom"}}
    run_all.write_report(part, str(out))
    assert json.loads(path.read_text()) == json.loads(before)


def test_a_full_run_with_a_failed_benchmark_keeps_its_published_entry(tmp_path):
    """A run of every benchmark where bench_rl timed out replaced the kind's file as it
    stood: the error record took the place of the published entry, and the kind's RL
    ratios left the summary. Only --only runs were merged."""
    out = tmp_path / "bench"
    full = _full_report()
    run_all.write_report(full, str(out))
    again = _full_report()
    again["created"] = "2026-12-05T12:00:00Z"
    again["benchmarks"]["bench_rl"] = {"status": "error", "error": "timed out after 1800 s"}
    run_all.write_report(again, str(out))
    kept = json.loads((out / "machines" / "amd-epyc-2c.json").read_text())
    assert kept["benchmarks"]["bench_rl"] == full["benchmarks"]["bench_rl"]
    assert kept["updates"][-1]["not_merged"] == {"bench_rl": "error"}
    row = summary.summary_rows(str(out / "machines"))[0]
    assert row["rl_iter_b0.0"] == 1.7
    # The row is dated by the runs its entries came from: bench_rl's from the first.
    assert row["run"].startswith("2026-11-23 (") and "2026-12-05" in row["run"]


def test_a_rows_dates_are_those_of_the_runs_its_entries_came_from():
    """Each benchmark dated by the last run that merged it: an update whose entries a
    later run replaced, and a full run nothing is left of, are not listed."""
    names = ["bench_rl", "bench_matmul"]
    report = {
        "created": "2026-11-23T08:00:00Z",
        "benchmarks": dict.fromkeys(names, {"status": "ok"}),
        "updates": [
            {"created": "2026-12-03T08:00:00Z", "benchmarks": ["bench_matmul"]},
            {"created": "2026-12-04T08:00:00Z", "benchmarks": ["bench_matmul"]},
        ],
    }
    assert summary._run_dates(report) == "2026-11-23 (bench_matmul 2026-12-04)"
    report["updates"].append({"created": "2026-12-05T08:00:00Z", "benchmarks": names})
    assert summary._run_dates(report) == "bench_rl, bench_matmul 2026-12-05"


def test_a_gpu_kinds_ratios_stay_out_of_the_cpu_summary(tmp_path, monkeypatch):
    # A full run_all on a GPU machine wrote machines/<kind with its GPU>.json, and its
    # RL ratio (6.3x on an H200) widened the CPU ranges README quotes.
    monkeypatch.setattr(run_all, "report_to_markdown", lambda r: "stub")
    out = tmp_path / "bench"
    run_all.write_report(_fake_report("AMD EPYC", 2, 1.7, 2.1), str(out))
    gpu = _fake_report("Intel Xeon Platinum", 16, 6.3, 9.0)
    gpu["machine"] |= dict(backend="gpu", device_kind="NVIDIA H200")
    (out / "machines" / "intel-xeon-platinum-16c-gpu.json").write_text(json.dumps(gpu))
    rows = summary.summary_rows(str(out / "machines"))
    assert [r["cpu"] for r in rows] == ["AMD EPYC"]
    assert summary.ratio_range(rows, "rl_iter_b0.0") == (1.7, 1.7)


def test_a_timed_out_benchmarks_children_are_killed_with_it(tmp_path, monkeypatch):
    """The per-benchmark timeout killed the benchmark's process only: a process it had
    started (bench_rl's TRL run) ran on beside the next benchmarks."""
    pkg = tmp_path / "nbh_slowbench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    pid_file = tmp_path / "child.pid"
    (pkg / "slow.py").write_text(
        "import subprocess, time\n"
        "def run(quick=False):\n"
        "    p = subprocess.Popen(['sleep', '60'])\n"
        f"    open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "    time.sleep(60)\n"
    )
    path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.chdir(ROOT)
    rec = run_all._run_isolated("nbh_slowbench.slow", False, 8.0)
    assert rec["status"] == "error" and "timed out after 8.0 s" in rec["error"]
    pid = int(pid_file.read_text())
    time.sleep(0.2)
    alive = os.path.exists(f"/proc/{pid}") and "Z" not in _proc_state(pid)
    assert not alive, f"the benchmark's child {pid} outlived its timeout"


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_summary_skips_the_legacy_folder(tmp_path, monkeypatch):
    """machines/legacy/ holds retired rows: kept, not summarised (nor in the ranges)."""
    monkeypatch.setattr(run_all, "report_to_markdown", lambda r: "stub")
    out = tmp_path / "bench"
    run_all.write_report(_fake_report("Intel(R) Xeon(R) CPU", 2, 0.8, 1.3), str(out))
    legacy = out / "machines" / summary.LEGACY_DIR
    legacy.mkdir()
    (legacy / "amd-epyc-2c.json").write_text(json.dumps(_fake_report("AMD EPYC", 2, 9.0, 9.0)))
    rows = summary.summary_rows(str(out / "machines"))
    assert [r["machine"] for r in rows] == ["intel-xeon-2c"]
    assert summary.ratio_range(rows, "rl_iter_b0.0") == (0.8, 0.8)
    assert "amd-epyc-2c" not in summary.summary_markdown(str(out / "machines"))


def test_trace_op_breakdown_groups_fusions_and_skips_frames(tmp_path):
    from benchmarks import xla_trace
    from tests._perfetto import write_trace

    events = [
        {"ph": "X", "name": "ynn_fusion.3", "dur": 3000},
        {"ph": "X", "name": "ynn_fusion", "dur": 1000},
        {"ph": "X", "name": "copy_bitcast_fusion.7", "dur": 2000},
        {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 99000},  # a frame: skipped
        {"ph": "X", "name": "$model.py:38 t", "dur": 99000},
        {"ph": "X", "name": "CommonPjRtLoadedExecutable::ExecuteHelperOnSingleDevice", "dur": 9},
        {"ph": "i", "name": "ynn_fusion.9", "dur": 5000},  # not a duration event
    ]
    write_trace(tmp_path, events, day="2026_11_23")
    got = xla_trace.op_breakdown(str(tmp_path), steps=2)
    assert got == {"ynn_fusion": 2.0, "copy_bitcast_fusion": 1.0}
    calls = xla_trace.op_calls(str(tmp_path))
    assert calls == {"ynn_fusion.3": 1, "ynn_fusion": 1, "copy_bitcast_fusion.7": 1}


def test_profile_step_scan_ab_for_another_model(monkeypatch):
    """--model smollm2 runs only the scan-vs-unrolled A/B, per micro-batch count and
    beta, each variant told the model; the table names the shape and the CPU."""
    from benchmarks import profile_step

    calls = []

    def fake(mb, tunable, beta, trace, ab="", model="tiny"):
        calls.append((mb, tunable, beta, ab, model))
        return {"microbatches": mb, "scan_median_s": 8.0 + beta, "unrolled_median_s": 4.0}

    monkeypatch.setattr(profile_step, "run_variant", fake)
    res = profile_step.run_scan_ab("smollm2", (4,))
    assert calls == [
        (4, True, 0.0, "scan_layers", "smollm2"),
        (4, True, 0.04, "scan_layers", "smollm2"),
    ]
    assert [r["beta"] for r in res["scan_layers_ab"]] == [0.0, 0.04]
    assert res["scan_layers_ab"][1]["speedup"] == 8.04 / 4.0
    res["machine"] = {"cpu_model": "AMD EPYC", "cpu_isa": "avx512", "cpu_usable": 2}
    table = profile_step.scan_table_markdown(res)
    assert "| 4 | 0.04 | 8.040 | 4.000 | 2.01x |" in table
    assert "bench_rl's `smollm2` shape, AMD EPYC (avx512), 2 cores" in table


def test_profile_ref_rows_table_and_flop_share(monkeypatch):
    """profile_ref runs one fresh process per listed micro-batch count (repeats
    allowed); each row's speed-ups are separate / in-step, per timing, and the
    in-step form's cost over the beta-0 baseline stands beside the FLOP share."""
    from benchmarks import bench_rl, profile_ref

    calls = []

    def fake(mb, which="ref"):
        calls.append(mb)
        k = len(calls)
        return {
            "microbatches": mb,
            "hugetlb": True,
            "none_iter_median_s": 0.6 * k,
            "separate_iter_median_s": 1.0 * k,
            "in_step_iter_median_s": 0.8 * k,
            "none_iter_step_median_s": 0.4,
            "separate_iter_step_median_s": 0.6,
            "in_step_iter_step_median_s": 0.5,
            "none_median_s": 0.4,
            "separate_median_s": 0.5,
            "in_step_median_s": 0.5,
        }

    monkeypatch.setattr(profile_ref, "run_variant", fake)
    res = profile_ref.run((4, 4))
    assert calls == [4, 4]
    assert [r["iter_speedup"] for r in res["ref_ab"]] == [1.0 / 0.8, 2.0 / 1.6]
    # The FLOP share by hand: the forward's 2NT over the step's 6NT plus attention
    # (bench_rl.model_flops, whose attention term is a sixth of a forward's or less).
    share = res["reference_flop_share"]
    rows, seq = 64, bench_rl.PROMPT_WORDS + 1 + bench_rl.NEW_TOKENS
    fwd = bench_rl.model_flops(rows, seq, beta=0.04) - bench_rl.model_flops(rows, seq, beta=0.0)
    assert share == pytest.approx(fwd / bench_rl.model_flops(rows, seq, beta=0.0))
    assert 0.30 < share <= 1 / 3
    res["machine"] = {"cpu_model": "AMD EPYC", "cpu_isa": "avx512", "cpu_usable": 2}
    table = profile_ref.table_markdown(res)
    assert "| RL iteration | 4 | 0.04 | 1.200 | 2.000 | 1.600 | 1.25x | +33% |" in table
    assert "| its step (time/step_s) | 4 | 0.04 | 0.400 | 0.600 | 0.500 | 1.20x | +25% |" in table
    assert "| the step alone, back to back | 4 | 0.04 | 0.400 | 0.500 | 0.500 | 1.00x | +25% |" in (
        table
    )
    assert f"model FLOPs: +{share:.0%}." in table
    # A run from before the beta-0 baseline renders without its columns.
    old = {"ref_ab": [{k: v for k, v in fake(4).items() if not k.startswith("none")}]}
    old["ref_ab"][0]["beta"] = 0.04
    assert "| RL iteration | 4 | 0.04 | 3.000 | 2.400 | 1.25x |" in profile_ref.table_markdown(old)


def test_profile_ref_old_logprob_pass_builds_its_forms_and_table(monkeypatch):
    """`--pass old` times the recomputed old log-probs: its child is asked for that
    pass, its rows are beta 0 under their own key, and the table names the old
    log-prob forms (not the reference pass's) beside a forward's FLOP share."""
    from benchmarks import profile_ref

    seen = []

    def fake_child(module, args):
        seen.append(list(args))
        return {
            f"{f}_{k}": v
            for f, v in (("none", 1.0), ("separate", 1.5), ("in_step", 1.2))
            for k in ("iter_median_s", "iter_step_median_s", "median_s")
        }

    monkeypatch.setattr(profile_ref.common, "run_child", fake_child)
    res = profile_ref.run((4,), "old")
    assert seen == [["--microbatches", "4", "--pass", "old"]]
    assert res["pass"] == "old" and "ref_ab" not in res and "reference_flop_share" not in res
    assert [(r["beta"], r["speedup"]) for r in res["old_ab"]] == [(0.0, 1.5 / 1.2)]
    assert res["forward_flop_share"] == profile_ref.flop_share()
    res["machine"] = {"cpu_model": "AMD EPYC", "cpu_isa": "avx512", "cpu_usable": 2}
    table = profile_ref.table_markdown(res)
    head = (
        "| timed | micro-batches | beta | sampler's log-probs, no pass: s (median) | old "
        "log-prob pass, then the step: s (median) | old log-probs from the step's forward: "
        "s (median) | speed-up | from the step: added over no pass |"
    )
    assert head in table and "reference" not in table
    assert "| RL iteration | 4 | 0 | 1.000 | 1.500 | 1.200 | 1.25x | +20% |" in table
    assert f"(a forward) of the step's model FLOPs: +{res['forward_flop_share']:.0%}." in table


def test_bench_rl_trl_child_parses_the_command_its_parent_builds(monkeypatch, tmp_path):
    """bench_trl_clean_env's child (`python -m benchmarks.rl_trl`) reads back every
    argument its parent passes, and runs bench_trl with them (the child is a separate
    module since bench_rl was split: a mismatch would fail only a full benchmark run)."""
    import importlib.util

    from benchmarks import rl_trl

    built: list[list[str]] = []

    class Proc:
        returncode = 1
        stderr = "stand-in"

    def fake_run(cmd, **kw):
        built.append(cmd)
        assert "GLIBC_TUNABLES" not in kw["env"]
        return Proc()

    monkeypatch.setattr("subprocess.run", fake_run)
    with pytest.raises(RuntimeError, match="stand-in"):
        rl_trl.bench_trl_clean_env("/ck", 0.04, warmup=2, iters=5, device="cuda", model="smollm2")
    (cmd,) = built
    assert cmd[1:3] == ["-m", "benchmarks.rl_trl"] and importlib.util.find_spec(cmd[2])
    got: dict = {}

    def fake_bench(ckpt, beta, **kw):
        got.update(ckpt=ckpt, beta=beta, **kw)
        return {"iter_s": [1.0]}

    monkeypatch.setattr(rl_trl, "bench_trl", fake_bench)
    out = tmp_path / "trl.json"  # the parent's temporary folder is gone by now
    monkeypatch.setattr("sys.argv", ["rl_trl", cmd[3], str(out), *cmd[5:]])
    rl_trl.main()
    assert got == dict(
        ckpt="/ck", beta=0.04, warmup=2, iters=5, device="cuda", shape=rl_trl.SHAPES["smollm2"]
    )
    assert json.loads(out.read_text()) == {"iter_s": [1.0]}


def test_bench_rl_alternates_rounds_and_pools_iterations(monkeypatch):
    """Each round runs both frameworks, the order alternating; figures are medians
    over every round's iterations, and each round's median is kept."""
    from benchmarks import bench_rl

    calls: list[tuple[str, float]] = []

    devices: list[str] = []
    shapes: list = []
    models: list[str] = []

    def fake(name: str, iters_s: list[list[float]]):
        def bench(ckpt, beta, *, warmup, iters, **kw):
            i = sum(1 for n, b in calls if n == name and b == beta) % len(iters_s)
            calls.append((name, beta))
            devices.extend([kw["device"]] if name == "trl" else [])
            shapes.extend([kw["shape"]] if name == "ours" else [])
            models.extend([kw["model"]] if name == "trl" else [])
            it = iters_s[i]
            out = {"iter_s": it, "sample_s": [0.25 * t for t in it], "reward_s": [0.0] * len(it)}
            out |= {"step_s": [0.75 * t for t in it], "len": [64.0] * len(it)}
            return out | ({"compiles": 1} if name == "ours" else {})

        return bench

    # ours: rounds [1, 2, 3] and [7, 8, 9] -> pooled median 5.0 (6 iterations: (3 + 7) / 2)
    monkeypatch.setattr(bench_rl, "bench_ours", fake("ours", [[1.0, 2.0, 3.0], [7.0, 8.0, 9.0]]))
    monkeypatch.setattr(
        bench_rl, "bench_trl_clean_env", fake("trl", [[10.0, 10.0, 10.0], [20.0, 30.0, 40.0]])
    )
    ckpts: list[str] = []
    monkeypatch.setattr(bench_rl, "make_checkpoint", lambda d, shape=None: ckpts.append(d) or d)
    peaks: list[tuple] = []

    def fake_peak(fw, n=1024, reps=20, device="cpu", calls=1):
        peaks.append((fw, n, device, calls))
        return 1e11

    monkeypatch.setattr(bench_rl, "matmul_peak", fake_peak)
    monkeypatch.setattr(bench_rl, "ROUNDS", 2)
    # A quiet machine, whatever runs beside the test: fake rounds take microseconds, and
    # one 10 ms jiffy of someone else's CPU in them read as a share far above 100 %.
    clock = iter(range(1000))
    monkeypatch.setattr(
        bench_rl.common,
        "host_counters",
        lambda: {"t": float(next(clock)), "load": 0.0, "busy_s": 5.0, "own_s": 0.0, "steal_s": 0.0},
    )
    res = bench_rl.run(quick=False)
    # On CPU: one 1024^3 product per round, on both sides, recorded and printed.
    assert peaks == [("jax", 1024, "cpu", 1), ("torch", 1024, "cpu", 1)]
    assert (res["matmul_peak_n"], res["matmul_peak_calls"]) == (1024, 1)
    assert "matmul peak (f32, 1024^3): jax 100.0 GFLOP/s" in bench_rl.table(res)
    assert len(ckpts) == 1 and not os.path.exists(ckpts[0])  # the checkpoint is removed
    # Round 0: ours then TRL; round 1: TRL then ours; per beta.
    order = [n for n, b in calls if b == 0.0]
    assert order == ["ours", "trl", "trl", "ours"]
    assert [n for n, b in calls if b == 0.04] == order
    r = res["results"]["beta=0.0"]
    # TRL: median(10, 10, 10, 20, 30, 40) = 15
    assert r["gdpo_jax"]["iter_s"] == 5.0 and r["trl"]["iter_s"] == 15.0
    assert r["gdpo_jax"]["round_iter_s"] == [2.0, 8.0]
    assert r["trl"]["round_iter_s"] == [10.0, 30.0]
    assert r["speedup_iter"] == pytest.approx(3.0)
    assert r["gdpo_jax"]["step_s"] == pytest.approx(3.75)  # median of 0.75 * iterations
    assert res["config"]["rounds"] == 2
    assert "beta 0.0: gdpo_jax 2.000, 8.000; trl 10.000, 30.000" in bench_rl.table(res)
    # Each round's own ratio (TRL's round median over ours), its step median, and the
    # other processes' share of the cores measured around each round.
    assert r["round_speedup_iter"] == pytest.approx([5.0, 3.75])
    assert r["gdpo_jax"]["round_step_s"] == pytest.approx([1.5, 6.0])
    fracs = r["gdpo_jax"]["round_other_cpu_frac"] + r["trl"]["round_other_cpu_frac"]
    assert fracs == [0.0] * 4
    assert "iteration ratio: beta 0.0: 5.00x, 3.75x; beta 0.04: 5.00x, 3.75x" in bench_rl.table(res)
    res["results"]["beta=0.04"]["trl"]["round_other_cpu_frac"] = [0.01, 0.4]
    assert (
        "beside other work (other processes' share of the cores): beta 0.04 trl round 2: 40%"
        in (bench_rl.table(res))
    )
    # The kernel's huge-page fallbacks and compaction stalls per round: unknown here (the
    # fake counters read no /proc/vmstat), and named in the table only where any happened.
    assert r["gdpo_jax"]["round_huge_page_fallbacks"] == [None, None]
    assert "fell back" not in bench_rl.table(res)
    r["gdpo_jax"]["round_huge_page_fallbacks"] = [0, 3]
    r["gdpo_jax"]["round_compaction_stalls"] = [0, 1]
    assert (
        "rounds whose huge pages fell back to small ones or waited for compaction: "
        "beta 0.0 gdpo_jax round 2: 3 fallbacks, 1 stalls"
    ) in bench_rl.table(res)
    # On the CPU backend TRL runs on the CPU too (on a GPU backend: CUDA, common.torch_device).
    assert res["trl_device"] == "cpu" and set(devices) == {"cpu"}
    calls.clear()
    assert bench_rl.run(quick=False, rounds=1)["config"]["rounds"] == 1
    assert [n for n, b in calls if b == 0.0] == ["ours", "trl"]
    assert shapes == [bench_rl.TINY] * 6 and models == ["tiny"] * 6
    # --model smollm2: both sides get its shape (TRL's child process by name).
    shapes.clear(), models.clear(), calls.clear()
    res = bench_rl.run(quick=False, rounds=1, model="smollm2")
    assert shapes == [bench_rl.SHAPES["smollm2"]] * 2 and models == ["smollm2"] * 2
    assert res["config"]["model"] == "smollm2" and res["config"]["vocab"] == 49152
    assert res["results"]["beta=0.0"]["gdpo_jax"]["seq"] == 9 + 64
    # On a GPU both peaks are common.matmul_peak's kind: 8192^3, 10 calls back to back
    # (one synchronised 1024^3 call per round timed its launch latency).
    import jax

    from benchmarks import common

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(common, "torch_device", lambda: "cuda")
    peaks.clear()
    res = bench_rl.run(quick=False, rounds=1)
    # (JAX's on its default backend: the fake's device argument stays unset.)
    assert peaks == [("jax", 8192, "cpu", 10), ("torch", 8192, "cuda", 10)]
    assert "matmul peak (f32, 8192^3, 10 calls back to back)" in bench_rl.table(res)


def test_bench_rl_matmul_peak_counts_every_call_of_a_round(monkeypatch):
    """FLOP/s = 2 n^3 x calls / the best round's seconds, on both frameworks."""
    from benchmarks import bench_rl

    monkeypatch.setattr(bench_rl, "_timed", lambda fn: (fn(), 0.5)[1])
    for fw in ("jax", "torch"):
        assert bench_rl.matmul_peak(fw, n=8, reps=2, calls=3) == 2 * 8**3 * 3 / 0.5


def test_bench_attention_quick_compares_kernels_with_the_f32_reference():
    """On CPU: the f32 einsum reference, then "xla" and "dpa" in bf16; each bf16 kernel
    is off the reference by bf16 rounding (not 0, not more than a loose bound)."""
    from benchmarks import bench_attention

    res = bench_attention.run(quick=True)
    rows = res["results"]
    assert [(r["attention"], r["dtype"]) for r in rows] == [
        ("xla", "float32"),
        ("xla", "bfloat16"),
        ("dpa", "bfloat16"),
    ]
    assert rows[0]["max_dlogp_vs_f32"] == 0.0 and rows[0]["grad_rel_l2_vs_f32"] == 0.0
    for r in rows[1:]:
        assert 0 < r["max_dlogp_vs_f32"] < 0.05 and 0 < r["grad_rel_l2_vs_f32"] < 0.05
        assert r["fwd_bwd_ms"] > 0 and r["temp_gib"] > 0
    assert abs(rows[1]["loss"] - rows[0]["loss"]) < 0.01
    # Greedy sampling with each kernel in the prefill: the einsum path's tokens.
    assert [r["attention"] for r in res["sampling"]] == ["xla", "dpa"]
    assert all(r["rows_same_tokens_as_xla"] == 1.0 for r in res["sampling"])
    assert res["sampling"][1]["max_dlogp_vs_xla"] < 0.05
    table = bench_attention.format_table(res)
    assert "| tiny | 2 | 64 | dpa | bfloat16 |" in table and "| tiny | dpa | 4 |" in table


def test_torch_device_follows_the_jax_backend(monkeypatch):
    """A torch reference runs on CUDA only where JAX's backend is a GPU and torch sees one."""
    import jax

    torch = pytest.importorskip("torch")
    assert common.torch_device() == "cpu"  # the suite's backend is the CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert common.torch_device() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert common.torch_device() == "cpu"


def test_time_interleaved_calls_in_turn_after_warmup(monkeypatch):
    """Warm-up calls first, then each round calls every function once, in order; best and
    median are over the timed rounds only (a fake clock: 1 s per call of "a", 3 of "b")."""
    calls: list[str] = []
    clock = [0.0]
    monkeypatch.setattr(common.time, "perf_counter", lambda: clock[0])

    def fn(name: str, cost: float):
        def call() -> None:
            calls.append(name)
            clock[0] += cost

        return call

    res = common.time_interleaved([fn("a", 1.0), fn("b", 3.0)], repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert res == [{"best_s": 1.0, "median_s": 1.0}, {"best_s": 3.0, "median_s": 3.0}]


def test_time_interleaved_times_the_last_call_of_each_turn(monkeypatch):
    """calls_per_turn=2: each turn calls its function twice; the second call is timed, the
    first reported apart (a fake clock where a call right after the other function's
    costs 5 s more, as a framework's first call after the other's did)."""
    calls: list[str] = []
    clock = [0.0]
    monkeypatch.setattr(common.time, "perf_counter", lambda: clock[0])

    def fn(name: str, cost: float):
        def call() -> None:
            clock[0] += cost + (5.0 if calls and calls[-1] != name else 0.0)
            calls.append(name)

        return call

    res = common.time_interleaved([fn("a", 1.0), fn("b", 3.0)], repeats=3, calls_per_turn=2)
    assert calls == ["a", "a", "b", "b"] * 3
    # The very first call follows nothing: a's first calls are 1 s once, then 6 s.
    assert res[0] == {"best_s": 1.0, "median_s": 1.0, "first_best_s": 1.0, "first_median_s": 6.0}
    assert res[1] == {"best_s": 3.0, "median_s": 3.0, "first_best_s": 8.0, "first_median_s": 8.0}
    with pytest.raises(ValueError, match="calls_per_turn=0"):
        common.time_interleaved([fn("a", 1.0)], repeats=1, calls_per_turn=0)


def test_quick_out_main_runs_prints_and_writes(tmp_path, monkeypatch, capsys):
    """The shared --quick/--out command line passes --quick to run, prints the rendered
    result and writes its JSON where --out says."""
    from benchmarks import common

    calls = []

    def run(quick: bool = False) -> dict:
        calls.append(quick)
        return {"quick": quick, "x": 1.5}

    out = tmp_path / "r.json"
    monkeypatch.setattr("sys.argv", ["bench", "--quick", "--out", str(out)])
    common.quick_out_main("Title line.\nmore", run, lambda r: f"table x={r['x']}", "unused.json")
    assert calls == [True]
    assert json.loads(out.read_text()) == {"quick": True, "x": 1.5}
    printed = capsys.readouterr().out
    assert "table x=1.5" in printed and f"wrote {out}" in printed


def test_command_line_quotes_arguments_with_spaces(monkeypatch):
    argv = ["/usr/bin/python3", "-m", "benchmarks.x", "--settings", "a b", "--out", "o.json"]
    monkeypatch.setattr(sys, "orig_argv", argv)
    line = common.command_line()
    assert line == "python -m benchmarks.x --settings 'a b' --out o.json"
    assert shlex.split(line)[1:] == argv[1:]


def test_trl_does_the_work_ours_does_and_older_runs_are_marked():
    # TRL 1.16's GRPOConfig turns gradient checkpointing on by default: its backward re-ran
    # every decoder layer, ours (model.remat=False) does not, and the ratios to TRL were
    # overstated. bench_rl's arguments turn it off and the result records it; the summary
    # marks the runs made before (no field) with a dagger.
    from benchmarks import bench_rl, summary
    from gdpo_jax.train.schema import base_config

    args = bench_rl.trl_args(bench_rl.TINY, 0.04, 3)
    assert args["gradient_checkpointing"] is False and base_config().model.remat is False
    assert args["bf16"] is False and args["multi_objective_aggregation"] == "normalize_then_sum"

    def report(config: dict) -> dict:
        rl = {"config": config, "results": {"beta=0.0": {"speedup_iter": 2.0, "speedup_step": 2.0}}}
        return {
            "created": "2026-12-05T00:00:00Z",
            "machine": {"cpu_model": "cpu", "cpu_usable": 2, "kind": "k"},
            "benchmarks": {"bench_rl": {"status": "ok", "result": rl}},
        }

    old, new = report({}), report({"trl_gradient_checkpointing": False})
    assert summary.headline(old)["trl_recomputed"] is True
    assert summary.headline(new)["trl_recomputed"] is False


def test_host_activity_counts_other_processes_cpu_not_ours(tmp_path):
    # Hand-worked: the machine was busy 7 s of 10 s on 2 cores; we and our waited-for
    # children used 4 s of it, so others used 3 s, 15 % of the cores' time.
    before = {"t": 100.0, "busy_s": 50.0, "steal_s": 1.0, "own_s": 2.0, "load": [0.5, 0.4, 0.3]}
    after = {"t": 110.0, "busy_s": 57.0, "steal_s": 1.5, "own_s": 6.0, "load": [1.0, 0.5, 0.3]}
    cores = os.cpu_count()
    act = common.host_activity(before, after)
    assert act["other_cpu_s"] == pytest.approx(3.0) and act["steal_s"] == pytest.approx(0.5)
    assert act["other_cpu_frac"] == pytest.approx(3.0 / (10.0 * cores))
    assert act["load_avg_start"] == [0.5, 0.4, 0.3] and act["wall_s"] == pytest.approx(10.0)
    # One 10 ms jiffy of others' CPU in a 1 ms window is the whole machine, not 5x it.
    tiny = common.host_activity(before, {**before, "t": 100.001, "busy_s": 50.01})
    assert tiny["other_cpu_frac"] == 1.0
    # /proc/stat's fields: user nice system idle iowait irq softirq steal (ticks).
    stat = tmp_path / "stat"
    tick = os.sysconf("SC_CLK_TCK")
    stat.write_text(
        f"cpu  {3 * tick} {tick} {2 * tick} {99 * tick} 7 {tick} {tick} {4 * tick} 0 0\n"
    )
    c = common.host_counters(str(stat))
    assert c["busy_s"] == pytest.approx(8.0) and c["steal_s"] == pytest.approx(4.0)
    unreadable = common.host_counters(str(tmp_path / "missing"), str(tmp_path / "missing"))
    assert unreadable["busy_s"] is None and unreadable["vm"] is None
    act = common.host_activity(unreadable, unreadable)
    assert act["other_cpu_frac"] is None and act["huge_page_fallbacks"] is None
    # /proc/vmstat's lines ("name count"): the huge-page faults, fallbacks and compaction
    # stalls between two readings (the other lines ignored); a missing key reads None.
    vm = tmp_path / "vmstat"
    vm.write_text("nr_free_pages 5\nthp_fault_alloc 100\nthp_fault_fallback 2\ncompact_stall 0\n")
    first = common.host_counters(str(stat), str(vm))
    assert first["vm"] == {"thp_fault_alloc": 100, "thp_fault_fallback": 2, "compact_stall": 0}
    vm.write_text("thp_fault_alloc 140\nthp_fault_fallback 5\ncompact_stall 1\nnr_free_pages 9\n")
    act = common.host_activity(first, common.host_counters(str(stat), str(vm)))
    assert (act["huge_page_faults"], act["huge_page_fallbacks"], act["compaction_stalls"]) == (
        40,
        3,
        1,
    )
    vm.write_text("thp_fault_alloc 140\n")
    assert common.host_counters(str(stat), str(vm))["vm"] is None
    # Readings without the kernel's counts (older records) give None, not an error.
    assert common.host_activity(before, after)["compaction_stalls"] is None


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux's /proc/stat")
def test_host_activity_sees_a_busy_process_that_is_not_ours():
    # A CPU-bound process this one has not waited for is someone else's work: its CPU
    # time between the two readings shows up as other processes' (tests running beside
    # this one can only add to it). The process burns a fixed 1 s of CPU between them,
    # whatever the machine's load, and says when it is done.
    import subprocess

    code = (
        "import sys, time\nsys.stdin.readline()\nt = time.process_time()\n"
        "while time.process_time() - t < 1.0: pass\nprint(flush=True)\ntime.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        before = common.host_counters()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        proc.stdout.readline()  # its 1 s of CPU spent
        after = common.host_counters()
    finally:
        proc.kill()
        proc.wait()
    act = common.host_activity(before, after)
    assert act["other_cpu_s"] >= 0.8, act
    assert act["other_cpu_frac"] > 0, act
    if os.path.exists("/proc/vmstat"):  # the kernel's counts read, and only ever grow
        assert min(act[n] for n in common.VMSTAT_KEYS.values()) >= 0, act


def test_summary_marks_ratios_of_a_benchmark_run_beside_other_work(tmp_path):
    # run_all records each benchmark's host activity; the summary marks the ratios of a
    # benchmark that ran while other processes used more than LOADED_FRAC of the cores
    # with a double dagger, and leaves the others (and runs from before) unmarked.
    def report(kind: str, rl_frac: float | None, sampler_frac: float) -> dict:
        rl = {
            "config": {"trl_gradient_checkpointing": False},
            "results": {"beta=0.0": {"speedup_iter": 1.7, "speedup_step": 1.3}},
        }
        sampler = {"results": [{"mode": "greedy", "speedup": 2.1}]}
        host = {} if rl_frac is None else {"host": {"other_cpu_frac": rl_frac}}
        return {
            "created": "2026-12-05T00:00:00Z",
            "quick": False,
            "command": "x",
            "machine": common.machine_info() | {"cpu_model": f"model {kind}", "cpu_usable": 2},
            "benchmarks": {
                "bench_rl": {"status": "ok", "result": rl} | host,
                "bench_sampler": {
                    "status": "ok",
                    "result": sampler,
                    "host": {"other_cpu_frac": sampler_frac, "load_avg_start": [0.25, 0, 0]},
                },
            },
        }

    machines = tmp_path / "machines"
    machines.mkdir()
    for kind, rl_frac, sampler_frac in (("a", 0.30, 0.01), ("b", None, 0.01)):
        (machines / f"{kind}.json").write_text(json.dumps(report(kind, rl_frac, sampler_frac)))
    row_a, row_b = summary.summary_rows(str(machines))
    assert row_a["loaded"] == ["bench_rl"] and row_b["loaded"] == []
    md = summary.summary_markdown(str(machines))
    line_a = next(x for x in md.splitlines() if x.startswith("| model-a"))
    line_b = next(x for x in md.splitlines() if x.startswith("| model-b"))
    assert "| 1.70x‡ |" in line_a and "| 1.30x‡ |" in line_a and "| 2.10x |" in line_a
    assert "‡" not in line_b
    assert "‡ Measured while other processes used more than 5%" in md
    # The machine file's summary table gives each benchmark's share and load average.
    text = run_all.report_to_markdown(report("a", 0.30, 0.01))
    assert "| bench_rl | ok |  | 30.0% |" in text and "| 1.0% | 0.25 |" in text


def test_the_helper_processes_a_benchmark_leaves_count_as_its_own_cpu(tmp_path):
    # The reward runner's workers are children of multiprocessing's forkserver, and
    # math-verify's helpers live until their process exits: both outlived the isolated
    # benchmark unwaited, their CPU time never reached run_all's RUSAGE_CHILDREN, and
    # host_activity counted it as other processes'. Stopped and waited for by
    # run_all.reap_children (the benchmark child's last act), it is the benchmark's.
    script = tmp_path / "fs.py"
    script.write_text(
        "import multiprocessing, resource, sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "def burn(_):\n"
        "    t = time.process_time()\n"
        "    while time.process_time() - t < 0.5:\n"
        "        pass\n"
        "if __name__ == '__main__':\n"
        "    with multiprocessing.get_context('forkserver').Pool(1) as p:\n"
        "        p.map(burn, [0])\n"
        "    def children():\n"
        "        r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "        return r.ru_utime + r.ru_stime\n"
        "    # A helper left running, as math-verify's are: 0.5 s of CPU, then it waits.\n"
        "    import subprocess\n"
        "    helper = subprocess.Popen([sys.executable, '-c', 'import time\\n'\n"
        "        't = time.process_time()\\nwhile time.process_time() - t < 0.5: pass\\n'\n"
        "        'print(flush=True)\\ntime.sleep(60)'], stdout=subprocess.PIPE)\n"
        "    helper.stdout.readline()  # its CPU spent\n"
        "    before = children()\n"
        "    if sys.argv[1] == 'stop':\n"
        "        from benchmarks import run_all\n"
        "        run_all.reap_children()\n"
        "    print(before, children(), helper.poll() is not None)\n"
        "    helper.kill()\n"
    )
    import subprocess

    def run(arg: str) -> tuple[float, float, str]:
        out = subprocess.run(
            [sys.executable, str(script), arg], capture_output=True, text=True, check=True
        )
        before, after, ended = out.stdout.split()
        return float(before), float(after), ended

    assert run("keep")[1] < 0.3  # the worker's and the helper's 0.5 s each, lost
    before, after, ended = run("stop")
    assert before < 0.3 and after >= 0.85 and ended == "True"


@pytest.mark.parametrize("hugetlb", [True, False])
def test_run_child_starts_a_fresh_process_and_reads_back_its_json(monkeypatch, hugetlb):
    """common.run_child: `python -m <module> --_child <file> <args>`, the huge-page
    tunable set or dropped from the environment, gdpo_jax's relaunch off; the JSON
    the child wrote comes back, and a failed child raises with its stderr."""
    import json
    import subprocess

    seen = {}

    def fake_run(cmd, env, capture_output, text, cwd=None):
        seen["cmd"], seen["env"], seen["cwd"] = cmd, env, cwd
        with open(cmd[cmd.index("--_child") + 1], "w") as f:
            json.dump({"median_s": 1.5}, f)
        return subprocess.CompletedProcess(cmd, seen.get("rc", 0), "", "boom at the end")

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    monkeypatch.setattr(subprocess, "run", fake_run)
    got = common.run_child("benchmarks.profile_ref", ["--microbatches", "4"], hugetlb=hugetlb)
    assert got == {"median_s": 1.5}
    assert seen["cmd"][1:4] == ["-m", "benchmarks.profile_ref", "--_child"]
    assert seen["cmd"][-2:] == ["--microbatches", "4"]
    assert seen["env"]["GDPO_JAX_NO_RELAUNCH"] == "1" and seen["cwd"] is None
    assert ("glibc.malloc.hugetlb=1" in seen["env"].get("GLIBC_TUNABLES", "")) is hugetlb
    seen["rc"] = 1
    with pytest.raises(RuntimeError, match="benchmarks.profile_ref process failed:\nboom"):
        common.run_child("benchmarks.profile_ref", [], hugetlb=hugetlb)


def test_compiled_with_traces_under_the_setting_and_restores_it():
    """Each compile sees the module constant it was given, even inside a `lax.cond`
    branch whose trace JAX caches (the cache is cleared around it); the constant is
    restored after."""
    import types

    import jax
    import jax.numpy as jnp

    knob = types.SimpleNamespace(SCALE=2.0)

    def branch(x):
        return x * knob.SCALE

    f = jax.jit(lambda x: jax.lax.cond(x.sum() > 0, branch, lambda x: x, x))
    x = jnp.ones(3)
    two, _ = common.compiled_with(knob, "SCALE", 2.0, f, x)
    five, text = common.compiled_with(knob, "SCALE", 5.0, f, x)
    assert float(two(x)[0]) == 2.0 and float(five(x)[0]) == 5.0
    assert "stablehlo" in text and knob.SCALE == 2.0


def test_scratch_dir_is_removed_when_the_process_exits(tmp_path):
    """common.scratch_dir: a fresh folder under the temp folder, still there while the
    process runs, gone once it exits (with what was written into it)."""
    import subprocess

    code = (
        "import os\n"
        "from benchmarks import common\n"
        "d = common.scratch_dir('bench_x_')\n"
        "open(os.path.join(d, 'f'), 'w').write('x')\n"
        "os.makedirs(os.path.join(d, 'sub', 'deep'))\n"
        "print(d, sorted(os.listdir(d)), flush=True)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout.split()
    assert out[0].startswith(str(tmp_path / "bench_x_")) and out[1:] == ["['f',", "'sub']"]
    assert not os.path.exists(out[0]) and list(tmp_path.iterdir()) == []


def test_publish_stamps_prints_and_writes(tmp_path, capsys):
    out = tmp_path / "r.json"
    res = {"benchmark": "x", "results": [1, 2]}
    common.publish(res, str(out), lambda r: f"| table of {len(r['results'])} |")
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["| table of 2 |", f"wrote {out}"]
    saved = json.loads(out.read_text())
    assert saved["results"] == [1, 2] and saved["machine"]["cpu_usable"] >= 1
    assert saved["command"].startswith("python ") and saved["measured_at"].endswith("Z")


def test_cpu_label_names_the_machine_as_the_table_footers_do():
    from benchmarks import common

    m = {"cpu_model": "AMD EPYC", "cpu_isa": "avx512", "cpu_usable": 2}
    assert common.cpu_label(m) == "AMD EPYC (avx512), 2 cores"
    assert common.cpu_label({}) == "? (), ? cores"  # a run that recorded no machine
