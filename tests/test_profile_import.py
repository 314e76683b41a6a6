"""benchmarks/profile_import: timing imports in fresh interpreters, and reading
`python -X importtime`'s lines."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

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
    """Each target timed once per round in a fresh interpreter; the traced target's
    import listed, its slowest module (one that sleeps 0.3 s) first; the re-exec's cost
    read from the two refusals by name; the children's ml_dtypes version recorded."""
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(0.3)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    refusal = ("-c", "import sys; sys.exit(2)")  # the CLI's refusal, as a stand-in
    targets = (
        P.Target(P.REEXEC, refusal, relaunch=True, status=2),
        P.Target("python", ("-c", "pass")),
        P.Target("slow", ("-c", "import slow_to_import")),
        P.Target(P.ONE_IMAGE, refusal, status=2),
    )
    monkeypatch.setattr(P, "TARGETS", targets)
    monkeypatch.setattr(P, "TRACED", "slow")
    res = P.run(quick=True)
    assert [r["target"] for r in res["rows"]] == [t.name for t in targets]
    assert res["repeats"] == 3 and [r["relaunch"] for r in res["rows"]] == [1, 0, 0, 0]
    assert res["rows"][2]["command"] == "python -c import slow_to_import"
    assert res["relaunch_cost_s"] == round(
        res["rows"][0]["median_s"] - res["rows"][3]["median_s"], 3
    )
    python, slow = res["rows"][1:3]
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


def test_a_child_with_another_status_raises_with_its_status():
    with pytest.raises(RuntimeError, match="import no_such_module_here: status 1"):
        P._wall_s(P.Target("missing", ("-c", "import no_such_module_here")))
    # A refusal that did not refuse (status 0, not 2) is as wrong.
    with pytest.raises(RuntimeError, match="status 0"):
        P._wall_s(P.Target("refusal", ("-c", "pass"), status=2))


def test_the_refusals_are_refused_before_any_work():
    """Each CLI target exits with its status, its error names the field, and the model
    field's refusal writes no workdir."""
    for t in P.TARGETS:
        if t.status:
            done = subprocess.run(
                [sys.executable, *t.args], env=P._env(), cwd=P.ROOT, capture_output=True
            )
            assert done.returncode == t.status, done.stderr[-2000:]
            assert done.stderr.decode().strip().startswith("error: config."), t.name
    assert not os.path.exists(P._REFUSED_WORKDIR)


def test_a_relaunched_child_starts_without_the_tunable(monkeypatch):
    """The re-executed CLI target starts as on a user's first run: no malloc tunable,
    the re-exec allowed; the others in one process image."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    assert "GLIBC_TUNABLES" not in P._env(relaunch=True)
    assert "GDPO_JAX_NO_RELAUNCH" not in P._env(relaunch=True)
    assert P._env()["GDPO_JAX_NO_RELAUNCH"] == "1" and P._env()["JAX_PLATFORMS"] == "cpu"
