"""benchmarks/profile_host: each probe is timed right after its own program call and
again straight after; the rollout's host time is its collect minus the sampler's
device time; the table renders a run."""

from __future__ import annotations

import time
import types

import pytest

from benchmarks import profile_host
from tests._bench_run import run_quick


def test_each_probe_is_timed_cold_after_its_own_program_then_warm() -> None:
    calls: list[str] = []
    state = {"cold": False}

    def program() -> None:
        calls.append("program")
        state["cold"] = True

    def probe(name: str):
        def run() -> None:
            calls.append(name)
            if state["cold"]:  # the first call after the program is slow
                state["cold"] = False
                time.sleep(0.02)

        return run

    res = profile_host.cold_and_warm(program, {"a": probe("a"), "b": probe("b")}, rounds=3)
    assert calls == ["program", "a", "a", "program", "b", "b"] * 3
    for name in ("a", "b"):
        assert res[name]["cold_ms"] >= 15.0 > 5.0 > res[name]["warm_ms"]


class _Sampler:
    def __init__(self, trainer: _Trainer) -> None:
        self.trainer = trainer

    def generate(self) -> types.SimpleNamespace:
        t = self.trainer
        return types.SimpleNamespace(info={"device_seconds": t.device[t.i]})


class _Trainer:
    """Stand-in: each iteration's rollout takes `collect` s, its sampler call
    reports `device` s of device time (methods on the classes, as the real ones)."""

    def __init__(self, collect: list[float], device: list[float]) -> None:
        self.collect, self.device, self.i = collect, device, 0
        self.sampler = _Sampler(self)

    def _collect(self, step: int) -> None:
        t0 = time.perf_counter()
        self.sampler.generate()
        time.sleep(max(self.collect[step] - (time.perf_counter() - t0), 0.0))

    def train_step(self, step: int) -> dict[str, float]:
        self.i = step
        self._collect(step)
        return {"time/iter_s": 10.0 + step}


def test_rollout_split_subtracts_the_samplers_device_time_per_iteration() -> None:
    collect = [0.2, 0.2, 0.05, 0.06, 0.07]
    device = [0.1, 0.1, 0.04, 0.03, 0.05]  # host rest: 10, 30, 20 ms after 2 warm-ups
    trainer = _Trainer(collect, device)
    res = profile_host.rollout_split(trainer, iterations=3, warmup=2)
    assert res["iter_s"] == 13.0  # median of the timed iterations 12, 13, 14
    assert res["sampler_device_s"] == 0.04
    # Sleeps only overshoot (a loaded CI machine: by milliseconds); without the
    # subtraction the host time would be 60 ms.
    assert 20.0 <= res["rollout_host_ms"] < 35.0
    assert 0.06 <= res["collect_s"] < 0.075
    # The wrappers are gone afterwards: the instance's own attributes again.
    assert "generate" not in vars(trainer.sampler) and "_collect" not in vars(trainer)


def test_table_renders_probes_and_rollout() -> None:
    res = {
        "beta": 0.0,
        "rounds": 8,
        "iterations": 8,
        "probes": {"eager `fold_in`": {"cold_ms": 13.75, "warm_ms": 0.32}},
        "rollout": {
            "iter_s": 0.991,
            "collect_s": 0.387,
            "sampler_device_s": 0.337,
            "rollout_host_ms": 46.7,
        },
        "machine": {"cpu_model": "CPU X", "cpu_isa": "avx2", "cpu_usable": 2},
    }
    text = profile_host.table_markdown(res)
    assert "| eager `fold_in` | 13.75 | 0.32 |" in text
    assert "CPU X (avx2), 2 cores; bench_rl's trainer, beta 0; medians of 8 rounds" in text
    assert "the sampler's device program 0.337 s and host work 46.7 ms." in text


@pytest.mark.slow
def test_quick_run_on_the_real_trainer(tmp_path) -> None:
    """End to end (`--quick`, a fresh interpreter) on bench_rl's real trainer: every
    probe is timed, the NumPy spread is cheaper than the eager JAX one it replaced, and
    the rollout's parts are consistent (device time within the rollout, the rollout
    within the iteration, the host rest their difference)."""
    res = run_quick("profile_host", tmp_path)
    probes = res["probes"]
    assert len(probes) == 3 and res["rounds"] == 2 and res["iterations"] == 2
    for t in probes.values():
        assert t["cold_ms"] > 0 and t["warm_ms"] > 0
    eager = next(t for n, t in probes.items() if "eager JAX" in n)
    numpy = next(t for n, t in probes.items() if "NumPy" in n)
    assert numpy["warm_ms"] < eager["warm_ms"]
    r = res["rollout"]
    assert 0 < r["sampler_device_s"] <= r["collect_s"] < r["iter_s"]
    # The median of two iterations is their mean, so here the median of the differences
    # is the difference of the medians (up to the JSON's rounding to 0.1 ms).
    host_s = r["collect_s"] - r["sampler_device_s"]
    assert r["rollout_host_ms"] / 1e3 == pytest.approx(host_s, abs=2e-4)
    assert res["machine"]["cpu_count"] >= 1
