"""tests/_once.py: a module fixture's result is computed by the first xdist worker
that asks and read back by the others; a failure stores nothing; without xdist the
process computes its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._once import once_per_session


class _Factory:
    """tmp_path_factory's two methods once_per_session uses, over a fixed base."""

    def __init__(self, base: Path) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)

    def getbasetemp(self) -> Path:
        return self.base

    def mktemp(self, name: str) -> Path:
        path = self.base / name
        path.mkdir()
        return path


def test_the_first_worker_computes_and_the_others_read_it_back(tmp_path, monkeypatch):
    calls = []

    def make(directory: Path) -> dict:
        calls.append(directory)
        (directory / "log").write_text("ran")
        return {"rows": [1, 2], "where": directory.name}

    for worker in ("gw0", "gw1", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        got = once_per_session(_Factory(tmp_path / f"popen-{worker}"), "launch", make)
        assert got == {"rows": [1, 2], "where": "launch"}
    assert calls == [tmp_path / "launch"]  # in the directory the workers share
    assert (tmp_path / "launch" / "log").read_text() == "ran"


def test_a_failed_computation_stores_nothing(tmp_path, monkeypatch):
    outcomes = iter([RuntimeError("launch failed"), [3]])

    def make(directory: Path) -> list:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    with pytest.raises(RuntimeError, match="launch failed"):
        once_per_session(_Factory(tmp_path / "popen-gw0"), "launch", make)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert once_per_session(_Factory(tmp_path / "popen-gw1"), "launch", make) == [3]


def test_without_xdist_the_process_computes_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    calls = []
    got = once_per_session(_Factory(tmp_path), "launch", lambda d: calls.append(d) or 7)
    assert got == 7 and calls == [tmp_path / "launch"]
    assert not (tmp_path.parent / "launch.json").exists()
