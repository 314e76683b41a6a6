"""benchmarks/profile_guard: the guard's cost is the guarded step over the unguarded
one, the check's share is its own time over the guarded step's, the "no_guard" form
patches the name the step calls, and bad arguments stop the CLI before any run."""

from __future__ import annotations

import inspect

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import profile_guard as G


def _fake_row(model: str, steps: int) -> dict:
    return {
        "model": model,
        "guard_median_s": 1.05,
        "guard_best_s": 0.99,
        "no_guard_median_s": 1.0,
        "no_guard_best_s": 1.0,
        "check_ms": 2.1,
        "params": 3_000_000,
        "microbatches": 4,
        "steps_timed": steps,
    }


def test_rows_costs_and_table(monkeypatch):
    calls = []

    def fake(model, steps):
        calls.append((model, steps))
        return _fake_row(model, steps)

    monkeypatch.setattr(G, "run_model", fake)
    res = G.run(("tiny", "smollm2"))
    assert calls == [("tiny", G.STEPS["tiny"]), ("smollm2", G.STEPS["smollm2"])]
    row = res["results"][0]
    # By hand: 1.05 / 1.0 - 1 = +5 %; best 0.99 / 1.0 - 1 = -1 %; 2.1 ms of 1.05 s = 0.2 %.
    assert row["cost"] == pytest.approx(0.05)
    assert row["cost_best"] == pytest.approx(-0.01)
    assert row["check_share"] == pytest.approx(0.002)
    res["machine"] = {"cpu_model": "AMD EPYC", "cpu_isa": "avx2", "cpu_usable": 2}
    table = G.table_markdown(res)
    assert "| tiny | 3.0M | 4 | 1.050 | 1.000 | +5.0% / -1.0% | 2.10 | 0.20% |" in table
    assert "AMD EPYC (avx2), 2 cores" in table
    assert f"tiny {G.STEPS['tiny']}, smollm2 {G.STEPS['smollm2']}." in table


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", "tiny,huge"], "--models='tiny,huge': 'huge' is not one of"),
        (["--steps", "-2"], "--steps=-2: give a positive count"),
    ],
)
def test_bad_arguments_stop_before_any_run(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(G, "run", lambda *a, **k: pytest.fail("ran with a bad argument"))
    with pytest.raises(SystemExit) as e:
        G.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_the_unguarded_form_patches_the_name_the_step_calls():
    """`_child` replaces gdpo_jax.train.step's `finite_update` while the step traces:
    that is the name the update calls, bound to the state module's check."""
    from gdpo_jax.train import state, step

    assert step.finite_update is state.finite_update
    assert "finite = finite_update(grad_norm, new_params)" in inspect.getsource(step)
    assert "step_mod.finite_update = " in inspect.getsource(G._child)


def test_the_check_alone_is_timed_on_real_weights():
    params = {"w": jnp.ones((64, 64)), "b": jnp.asarray(np.zeros(64, np.float32))}
    ms = G._check_ms(params, calls=3)
    assert 0.0 < ms < 1e4
