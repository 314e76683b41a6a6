r"""What the non-finite update guard costs the RL step on XLA:CPU.

Each update of the step (gdpo_jax/train/step.py) checks its gradient norm and
every updated weight for NaN / inf (`state.finite_update`) and keeps the old
weights and optimizer state when one is not finite; the loop then stops the run
(`NonFiniteUpdateError`). The check reads every updated weight once per update.
One process per model builds bench_rl's step (bench_rl's layout: layers
unrolled, prompt sharing, its micro-batch count, beta 0) twice and times the two
alternately, so machine noise between processes does not enter:

- ``guard``: the step as shipped;
- ``no_guard``: the same step built with ``finite_update`` returning True (the
  selection of the kept weights stays: a mini-batch without a token keeps them too).

Beside the A/B, the check alone: ``finite_update`` over the model's weights as
its own jitted call (median ms), the cost it would add per update if XLA fused
none of it into the update. Its share of the step is that times the updates per
step (one per micro-batch loop: `algo.updates_per_step`, 1 here).

    python -m benchmarks.profile_guard [--models tiny,smollm2] [--steps 12] \
        [--out docs/benchmarks/profile_guard_<kind>.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks import common

DEFAULT_OUT = "runs/bench/profile_guard.json"
FORMS = ("guard", "no_guard")
STEPS = {"tiny": 12, "smollm2": 6}  # timed steps per form, alternating
CHECK_CALLS = 30  # timed calls of the check alone


def _check_ms(params: Any, calls: int = CHECK_CALLS) -> float:
    """Median ms of `state.finite_update` over `params` as its own jitted call."""
    import jax
    import jax.numpy as jnp

    from gdpo_jax.train.state import finite_update

    check = jax.jit(finite_update)
    norm = jnp.float32(1.0)
    jax.block_until_ready(check(norm, params))
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(check(norm, params))
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _child(model: str, steps: int) -> dict[str, Any]:
    """One process: the two forms' trainers, timed alternately (module docstring)."""
    import jax
    import jax.numpy as jnp

    from benchmarks.profile_step import _alternate, _step_seconds, _trainer
    from benchmarks.rl_setup import SHAPES
    from gdpo_jax.train import step as step_mod

    shape = SHAPES[model]
    kw = dict(scan_layers=shape.scan_layers, model=model, share_prompt=True)
    pairs = {"guard": _trainer(shape.microbatches, 0.0, **kw)}
    shipped = step_mod.finite_update
    # The step traces on its first call: that call happens while the patch is in place.
    step_mod.finite_update = lambda grad_norm, new_params: jnp.bool_(True)
    try:
        pairs["no_guard"] = _trainer(shape.microbatches, 0.0, **kw)
        _step_seconds(*pairs["no_guard"])
    finally:
        step_mod.finite_update = shipped
    out = _alternate([pairs[f] for f in FORMS], FORMS, steps)
    params = pairs["guard"][0].state.params  # after the steps: they donate the state's
    n_params = sum(int(x.size) for x in jax.tree.leaves(params))
    return out | {
        "check_ms": _check_ms(params),
        "params": n_params,
        "microbatches": shape.microbatches,
        "steps_timed": steps,
    }


def run_model(model: str, steps: int) -> dict[str, Any]:
    """One model's A/B in a fresh process with the huge-page tunable (as bench_rl)."""
    args = ["--models", model, "--steps", str(steps)]
    return {"model": model, **common.run_child("benchmarks.profile_guard", args)}


def with_costs(row: dict[str, Any]) -> dict[str, Any]:
    """`row` plus the guard's measured cost over the unguarded step (median and best
    steps) and the check alone's share of the guarded step's median."""
    g, n = row["guard_median_s"], row["no_guard_median_s"]
    return row | {
        "cost": g / n - 1.0,
        "cost_best": row["guard_best_s"] / row["no_guard_best_s"] - 1.0,
        "check_share": row["check_ms"] / (1e3 * g),
    }


def run(models: tuple[str, ...] = ("tiny", "smollm2"), steps: int | None = None) -> dict:
    """Every listed model, each in a fresh process; a JSON-able dict."""
    rows = [with_costs(run_model(m, steps or STEPS[m])) for m in models]
    return {"benchmark": "profile_guard", "results": rows}


def table_markdown(res: dict) -> str:
    """The comparison's markdown table (docs/benchmarks.md)."""
    rows = [
        {
            "model": r["model"],
            "weights": f"{r['params'] / 1e6:.1f}M",
            "micro-batches": r["microbatches"],
            "guarded step: s (median)": f"{r['guard_median_s']:.3f}",
            "without the check: s (median)": f"{r['no_guard_median_s']:.3f}",
            "guard's cost (median / best)": f"{r['cost']:+.1%} / {r['cost_best']:+.1%}",
            "the check alone: ms": f"{r['check_ms']:.2f}",
            "its share of the step": f"{r['check_share']:.2%}",
        }
        for r in res["results"]
    ]
    m = res.get("machine", {})
    steps = ", ".join(f"{r['model']} {r['steps_timed']}" for r in res["results"])
    return (
        common.markdown_table(rows) + f"\n\n{common.cpu_label(m)}; "
        f"bench_rl's step at beta 0 (layers unrolled, prompt sharing), huge pages on; "
        f"steps of each form, alternating, one process per model: {steps}."
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,smollm2", help="comma-separated bench_rl.SHAPES keys")
    ap.add_argument("--steps", type=int, default=0, help="timed steps per form (0: STEPS)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--_child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    from benchmarks.rl_setup import SHAPES

    models = tuple(a.models.split(","))
    bad = [m for m in models if m not in SHAPES]
    if bad:
        ap.error(f"--models={a.models!r}: {bad[0]!r} is not one of {sorted(SHAPES)}.")
    if a.steps < 0:
        ap.error(f"--steps={a.steps}: give a positive count, or 0 for the defaults.")
    if a._child:
        common.write_json(a._child, _child(models[0], a.steps or STEPS[models[0]]))
        return
    common.check_out(ap, a.out, "--out", is_dir=False)  # before the run
    res = run(models, a.steps or None)
    common.publish(res, a.out, table_markdown)


if __name__ == "__main__":
    main()
