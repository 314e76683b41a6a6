"""benchmarks/profile_import: timing imports in fresh interpreters, and reading
`python -X importtime`'s lines."""

from __future__ import annotations

import importlib.metadata

import pytest

from benchmarks import profile_import as P

IMPORTTIME = """\
import time: self [us] | cumulative | imported package
import time:       120 |        120 |   _io
import time:      2500 |       2620 | small
import time:    900000 |     905000 |     slow._ext
import time:      4000 |     909000 |   slow
"""


def test_importtime_lines_become_ms_slowest_own_time_first():
    rows = P.parse_importtime("some other stderr line\n" + IMPORTTIME)
    assert [r["module"] for r in rows] == ["slow._ext", "slow", "small", "_io"]
    assert rows[0] == {"module": "slow._ext", "self_ms": 900.0, "cumulative_ms": 905.0}
    assert rows[2]["self_ms"] == 2.5 and rows[3]["cumulative_ms"] == 0.12


def test_quick_run_times_each_target_in_turn_and_names_the_slow_module(monkeypatch, tmp_path):
    """Each target timed once per round in a fresh interpreter; the last target's
    import traced, its slowest module (one that sleeps 0.3 s) first; the children's
    ml_dtypes version recorded."""
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(0.3)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    slow = ("slow", ("-c", "import slow_to_import"), False)
    monkeypatch.setattr(P, "TARGETS", (("python", ("-c", "pass"), False), slow))
    # The CLI's refusal (status 2), as a stand-in that exits 2 at once.
    monkeypatch.setattr(P, "CLI", ("-c", "import sys; sys.exit(2)"))
    cli = (("cli, re-executed", P.CLI, True), ("cli, one process", P.CLI, False))
    monkeypatch.setattr(P, "CLI_TARGETS", cli)
    res = P.run(quick=True)
    assert [r["target"] for r in res["rows"]] == ["python", "slow", *(c[0] for c in cli)]
    assert res["repeats"] == 3 and [r["relaunch"] for r in res["rows"]] == [0, 0, 1, 0]
    assert res["rows"][1]["command"] == "python -c import slow_to_import"
    assert res["relaunch_cost_s"] == round(
        res["rows"][2]["median_s"] - res["rows"][3]["median_s"], 3
    )
    python, slow = res["rows"][:2]
    # Wall times hold the child's whole run: the 0.3 s sleep at least (no comparison
    # between two targets' times, which machine load can reorder).
    assert 0 < python["best_s"] <= python["median_s"]
    assert 0.3 <= slow["best_s"] <= slow["median_s"] < 30
    first = res["top_self_ms"][0]
    assert first["module"] == "slow_to_import" and 300 <= first["self_ms"] < 3000
    assert len(res["top_self_ms"]) == P.TOP and res["trainer_import_ms"] >= first["self_ms"]
    assert res["ml_dtypes"] == importlib.metadata.version("ml_dtypes")
    text = P.format_table(res)
    assert f"ml_dtypes {res['ml_dtypes']}" in text and "| slow |" in text


def test_a_failing_child_raises_with_its_status():
    with pytest.raises(RuntimeError, match="import no_such_module_here: status 1"):
        P._wall_s(("-c", "import no_such_module_here"))


def test_a_relaunched_child_starts_without_the_tunable(monkeypatch):
    """The re-executed CLI target starts as on a user's first run: no malloc tunable,
    the re-exec allowed; the others in one process image."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    assert "GLIBC_TUNABLES" not in P._env(relaunch=True)
    assert "GDPO_JAX_NO_RELAUNCH" not in P._env(relaunch=True)
    assert P._env()["GDPO_JAX_NO_RELAUNCH"] == "1" and P._env()["JAX_PLATFORMS"] == "cpu"
