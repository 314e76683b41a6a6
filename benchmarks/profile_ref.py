r"""What the reference pass costs the RL step on XLA:CPU, and in which program.

At beta > 0 the KL term needs the reference policy's log-probs. The step can run
that forward in its own micro-batch loop (`StepConfig.ref_logp_in_step`, on with
one update per batch) or take them from a separate log-prob program run before
it. At bench_rl's beta 0.04 layout (3M Llama, 64 rows, 4 micro-batches, layers
unrolled, prompt sharing), one process builds three trainers and times them
alternately:

- ``none``: beta 0, no reference pass (the baseline);
- ``separate``: beta 0.04, the reference log-probs from the separate program;
- ``in_step``: beta 0.04, the reference forward inside the step;

first whole RL iterations (sampling, rewards, the reference log-probs, the step;
the step's `time/step_s` too), then the step alone, back to back. Every timed
step is the RL loop's: at beta > 0 it includes the reference log-probs, whichever
program computes them. The reference forward's measured cost,
(in_step - none) / none, is set beside its model-FLOP share,
bench_rl.model_flops at beta 0.04 over beta 0, minus one: the forward's 2NT
against the step's 6NT + attention.

Each listed micro-batch count (repeats allowed) runs in a fresh process:

    python -m benchmarks.profile_ref --microbatches 4,4,4 \
        --out docs/benchmarks/profile_ref_<kind>.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from typing import Any

from benchmarks import common

STEPS = 12  # timed iterations, then timed steps, per form
BETA = 0.04
FORMS = ("none", "separate", "in_step")


def _with_ref_in_step(trainer: Any, on: bool) -> None:
    """Rebuilds the trainer's step with `StepConfig.ref_logp_in_step` = on (off: the
    reference log-probs from the separate log-prob program, as with several updates)."""
    from gdpo_jax.train import state as state_lib
    from gdpo_jax.train.step import CompiledStep

    trainer.step_cfg = dataclasses.replace(trainer.step_cfg, ref_logp_in_step=on)
    trainer.step = CompiledStep(
        graphdef=trainer.graphdef,
        tx=trainer.tx,
        schedule=trainer.schedule,
        cfg=trainer.step_cfg,
        state_shardings=state_lib.shardings_of(trainer.state),
        mesh=trainer.mesh,
    )


def _child(microbatches: int) -> dict[str, Any]:
    """One process: the three forms' trainers, timed alternately (module docstring);
    {<form>_iter_median_s, <form>_iter_step_median_s, <form>_median_s, <form>_best_s}."""
    from benchmarks.profile_step import _alternate, _trainer

    pairs = {}
    for form in FORMS:
        beta = 0.0 if form == "none" else BETA
        pairs[form] = _trainer(microbatches, beta, scan_layers=False, share_prompt=True)
        if form != "none":
            _with_ref_in_step(pairs[form][0], form == "in_step")
    iters: dict[str, list[float]] = {n: [] for n in pairs}
    steps: dict[str, list[float]] = {n: [] for n in pairs}
    for i in range(2 + STEPS):  # two untimed iterations each first
        for name, (trainer, _) in pairs.items():
            m = trainer.train_step(i)
            if i >= 2:
                iters[name].append(m["time/iter_s"])
                steps[name].append(m["time/step_s"])
    out = {f"{n}_iter_median_s": statistics.median(t) for n, t in iters.items()}
    out |= {f"{n}_iter_step_median_s": statistics.median(t) for n, t in steps.items()}
    return out | _alternate(list(pairs.values()), FORMS, STEPS)


def flop_share() -> float:
    """The reference forward's model FLOPs over the beta-0 step's (bench_rl's count,
    at bench_rl's rows and full sequence length)."""
    from benchmarks import bench_rl as B

    rows = B.TINY.prompts * B.TINY.generations
    seq = B.PROMPT_WORDS + 1 + B.TINY.new_tokens
    return B.model_flops(rows, seq, beta=BETA) / B.model_flops(rows, seq, beta=0.0) - 1.0


def run_variant(microbatches: int) -> dict[str, Any]:
    """One micro-batch count in a fresh process, with the huge-page tunable."""
    res = common.run_child("benchmarks.profile_ref", ["--microbatches", str(microbatches)])
    return {"microbatches": microbatches, "hugetlb": True, **res}


def run(microbatches: tuple[int, ...] = (4,)) -> dict[str, Any]:
    """Every listed micro-batch count, each in a fresh process; a JSON-able dict."""
    rows = []
    for m in microbatches:
        r = run_variant(m)
        r["beta"], r["speedup"] = BETA, r["separate_median_s"] / r["in_step_median_s"]
        r["iter_speedup"] = r["separate_iter_median_s"] / r["in_step_iter_median_s"]
        rows.append(r)
    return {
        "benchmark": "profile_ref",
        "ab_steps_timed": STEPS,
        "reference_flop_share": flop_share(),
        "ref_ab": rows,
    }


_TIMINGS = (
    ("RL iteration", "iter_median_s"),
    ("its step (time/step_s)", "iter_step_median_s"),
    ("the step alone, back to back", "median_s"),
)


def table_markdown(res: dict) -> str:
    """The comparison's markdown table (docs/benchmarks.md). Runs with the beta-0
    baseline (`none_*`, since 2026-12-05) add its column and the reference forward's
    measured cost over it, beside its FLOP share."""
    rows = []
    for r in res.get("ref_ab", []):
        for what, key in _TIMINGS:
            row = {
                "timed": what,
                "micro-batches": r["microbatches"],
                "beta": r["beta"],
            }
            if f"none_{key}" in r:
                row["beta 0, no reference: s (median)"] = f"{r[f'none_{key}']:.3f}"
            row |= {
                "reference pass, then the step: s (median)": f"{r[f'separate_{key}']:.3f}",
                "reference forward in the step: s (median)": f"{r[f'in_step_{key}']:.3f}",
                "speed-up": f"{r[f'separate_{key}'] / r[f'in_step_{key}']:.2f}x",
            }
            if f"none_{key}" in r:
                cost = r[f"in_step_{key}"] / r[f"none_{key}"] - 1.0
                row["in the step: added over beta 0"] = f"{cost:+.0%}"
            rows.append(row)
    m = res.get("machine", {})
    text = (
        common.markdown_table(rows)
        + f"\n\nbench_rl's layout (layers unrolled, prompt sharing), {m.get('cpu_model')} "
        f"({m.get('cpu_isa', '')}), {m.get('cpu_usable')} cores; huge pages on; "
        f"{res.get('ab_steps_timed', '?')} of each (iterations, then steps), alternating, "
        "each micro-batch entry (its three rows) in a fresh process."
    )
    if "reference_flop_share" in res:
        text += (
            f" The reference forward's share of the beta-0 step's model FLOPs: "
            f"+{res['reference_flop_share']:.0%}."
        )
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--microbatches", default="4", help="comma-separated, repeats allowed")
    ap.add_argument("--out", default="runs/bench/profile_ref.json")
    ap.add_argument("--_child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._child:
        common.write_json(a._child, _child(int(a.microbatches)))
        return
    common.check_out(ap, a.out, "--out", is_dir=False)  # before the run
    try:
        mbs = tuple(int(x) for x in a.microbatches.split(","))
    except ValueError:
        ap.error(f"--microbatches={a.microbatches!r}: give comma-separated integers, e.g. 4,4,4.")
    res = run(mbs)
    res["machine"] = common.machine_info()
    print(table_markdown(res))
    print(f"wrote {common.write_json(a.out, res)}")


if __name__ == "__main__":
    main()
