r"""Where the RL step's time goes, by product: bench_rl's step in bench_rl's layout
(unrolled layers, prompt sharing, 4 micro-batches) traced, and each XLA:CPU
operation named after what it computes.

The trace's operations are joined with the optimized HLO of the step (dumped
with ``--xla_dump_to``, which this script sets for its own process) through
benchmarks/xla_trace.py. `categorize` names each instruction:

* the weight products of gdpo_jax/core/dense.py, by their einsum: the
  forward ``x @ W``, the input gradient ``dY @ Wᵀ`` and the weight gradient
  ``xᵀ @ dY``, each with the FLOP/s it ran at (FLOPs from the HLO's shapes,
  over its share of the time, below);
* XLA's generic dots (the ``dot`` emitter, not YNNPACK): any product XLA:CPU
  did not hand to YNNPACK, whatever it computes;
* the attention dots YNNPACK runs (gdpo_jax/models/attention.py's einsums,
  forward and backward);
* transposes: layout copies whose jax operation is a transpose (core.dense's
  materialized xᵀ before each weight gradient, the attention's head layout);
* YNNPACK's reductions (RMS norms, softmax, log-softmax);
* everything else ("other": the elementwise fusions, the optimizer, ...).

Time is shared: XLA:CPU runs independent operations side by side (the gate
and up products of one input, q, k and v), each then slower than alone, so
each instant that k operations run at once counts 1/k to each
(`xla_trace.op_ms_shared`). The categories then sum to the time during which
any operation runs, close to the step's wall time (reported beside it, with
the operations' summed durations, which count shared cores twice).

    python -m benchmarks.profile_step_ops [--quick] [--beta 0.04] [--model smollm2] \
        [--out runs/bench/step_ops.json]

``--model smollm2`` traces bench_rl's SmolLM2-135M step (``bench_rl.SHAPES``, its own
micro-batches and layout), with fewer timed steps (each takes seconds).
"""

from __future__ import annotations

import argparse
import collections
import math
import re
import statistics
import tempfile
from typing import Any

from benchmarks import common, xla_trace
from benchmarks.profile_decode_ops import ATTENTION as ATTENTION_SPECS
from benchmarks.rl_setup import SHAPES

DEFAULT_OUT = "runs/bench/step_ops.json"
MODULE = "train_step"  # the step's jitted function (gdpo_jax/train/step.py)
FORWARD = "weight products: forward x @ W"
INPUT_GRAD = "weight products: input gradient dY @ Wᵀ"
WEIGHT_GRAD = "weight products: weight gradient xᵀ @ dY"
WEIGHT_SPECS = {"...d,df->...f": FORWARD, "...f,df->...d": INPUT_GRAD, "d...,...f->df": WEIGHT_GRAD}
GENERIC_DOTS = "XLA's generic dots (not YNNPACK)"
ATTENTION = "attention dots (YNNPACK)"
TRANSPOSES = "transposes (layout copies)"
REDUCTIONS = "reductions (YNNPACK)"
OTHER = "other"
_SPEC = re.compile(r"[a-z.]+,[a-z.]+->[a-z.]+")


def categorize(hlo: str) -> dict[str, str]:
    """{HLO instruction name: category} for every instruction of the step's optimized
    HLO text that carries op_name metadata (see the module docstring)."""
    out = {}
    for name, ins in xla_trace.instructions(hlo).items():
        op = ins.op_name
        if not op:
            continue
        specs = _SPEC.findall(op)
        spec = specs[-1] if specs else ""  # the innermost einsum the instruction is part of
        ynn = name.startswith("ynn_fusion")
        if ins.opcode == "dot":
            out[name] = GENERIC_DOTS
        elif ynn and spec in WEIGHT_SPECS:
            out[name] = WEIGHT_SPECS[spec]
        elif ynn and spec in ATTENTION_SPECS:
            out[name] = ATTENTION
        elif op.rsplit("/", 1)[-1] == "transpose":
            out[name] = TRANSPOSES
        elif ynn and op.rsplit("/", 1)[-1].startswith("reduce_"):
            out[name] = REDUCTIONS
        else:
            out[name] = OTHER
    return out


def summarize(ops: dict[str, float], calls: dict[str, int], hlo: str, steps: int) -> dict[str, Any]:
    """Per category (largest first): ms per step (`ops`: ms per operation over `steps`
    traced steps, concurrent operations sharing time), and for the weight products
    their GFLOP/s over that time (`calls`: how often each ran). Traced operations
    the HLO does not name count as "other"."""
    cats = categorize(hlo)
    table = xla_trace.instructions(hlo)
    weights = set(WEIGHT_SPECS.values())
    ms: collections.Counter = collections.Counter()
    by_shape: dict[tuple, list] = collections.defaultdict(lambda: [0, 0.0])
    unknown = 0
    for name, t in ops.items():
        cat = cats.get(name, OTHER)
        ms[cat] += t / steps
        if cat in weights:
            f = xla_trace.dot_flops(table[name], table)
            if f is None:
                unknown += 1
                continue
            row = by_shape[(cat, table[name].dims, f)]
            row[0], row[1] = row[0] + calls.get(name, 0), row[1] + t
    return {
        "ms_per_step": {k: round(v, 3) for k, v in ms.most_common()},
        "gflops": xla_trace.rates(ops, calls, cats, hlo, weights),
        "weight_gflop_per_step": round(
            sum(f * n for (_, _, f), (n, _) in by_shape.items()) / steps / 1e9, 3
        ),
        "products_without_flops": unknown,
        # Per category and output shape (the largest first): calls and ms per step, and
        # GFLOP/s over that ms (K = FLOPs / 2 / output size).
        "products": [
            {
                "category": cat,
                "out": "x".join(map(str, dims)),
                "k": f // 2 // math.prod(dims),
                "calls_per_step": n / steps,
                "ms_per_step": round(t / steps, 3),
                "gflops": round(f * n / t / 1e6, 1) if t else None,
            }
            for (cat, dims, f), (n, t) in sorted(by_shape.items(), key=lambda kv: -kv[1][1])
        ],
        "other_kinds_ms_per_step": xla_trace.other_kinds(ops, cats, steps),
    }


def run(
    quick: bool = False, beta: float = 0.0, dump_dir: str = "", model: str = "tiny"
) -> dict[str, Any]:
    """Times and traces bench_rl's step at `model`'s shape (bench_rl.SHAPES); dump_dir:
    where this process's XLA dumps its HLO."""
    import jax

    from benchmarks import bench_rl
    from benchmarks.profile_step import _step_seconds, _trainer

    shape = bench_rl.SHAPES[model]
    trainer, batch = _trainer(
        shape.microbatches,
        beta,
        scan_layers=shape.scan_layers,
        model=model,
        share_prompt=bench_rl.OURS_SHARE_PROMPT,
    )
    traced = 2
    timed = 3 if quick or model != "tiny" else 12
    try:
        for _ in range(2):
            _step_seconds(trainer, batch)  # compiles, warms
        walls = [_step_seconds(trainer, batch) for _ in range(timed)]
        with tempfile.TemporaryDirectory() as tmp:
            jax.profiler.start_trace(tmp, create_perfetto_trace=True)
            for _ in range(traced):
                _step_seconds(trainer, batch)
            jax.profiler.stop_trace()
            ops, durations, calls = xla_trace.op_times(tmp)
            summed = sum(durations.values()) / traced
    finally:
        trainer.runner.close()
    hlo = xla_trace.module_hlo(dump_dir, MODULE, set(ops))
    res = summarize(ops, calls, hlo, traced)
    return {
        "benchmark": "profile_step_ops",
        "quick": quick,
        "beta": beta,
        "model": model,
        "microbatches": shape.microbatches,
        "wall_best_s": round(min(walls), 4),
        "wall_median_s": round(statistics.median(walls), 4),
        "traced_ms_per_step": round(sum(res["ms_per_step"].values()), 3),
        "summed_ms_per_step": round(summed, 3),
        **res,
    }


def _model_name(model: str) -> str:
    """The caption's model: nothing for bench_rl's own (the runs before --model)."""
    return {"tiny": "", "smollm2": "SmolLM2-135M "}.get(model, f"{model} ")


def table_markdown(res: dict[str, Any]) -> str:
    """The markdown table of a run (docs/benchmarks.md shows the committed run's)."""
    total = res["traced_ms_per_step"]
    rows = [
        {
            "part of the step": k,
            "ms per step": f"{v:.1f}",
            "share": f"{v / total:.0%}",
            "GFLOP/s": f"{res['gflops'][k]:.0f}" if k in res["gflops"] else "",
        }
        for k, v in res["ms_per_step"].items()
    ]
    m = res.get("machine", {})
    return (
        common.markdown_table(rows)
        + f"\n\n{common.cpu_label(m)}; bench_rl's {_model_name(res.get('model', 'tiny'))}"
        f"step (beta {res['beta']:g}, "
        f"{res['microbatches']} micro-batches, "
        f"layers unrolled, prompt sharing), two traced steps: operations ran {total:.1f} ms "
        f"per step (concurrent ones sharing the time; their durations sum to "
        f"{res['summed_ms_per_step']:.1f}), {res['weight_gflop_per_step']:.1f} GFLOP of "
        "weight products, GFLOP/s over their share of the time; untraced steps "
        f"{res['wall_best_s'] * 1e3:.0f} ms (best), {res['wall_median_s'] * 1e3:.0f} "
        "(median). Largest kinds in other: "
        + ", ".join(f"`{k}` {v:.1f}" for k, v in res["other_kinds_ms_per_step"].items())
        + "."
    )


def main() -> None:
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers, as run_all's children
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    common.check_out(ap, args.out, "--out", is_dir=False)  # before the run
    with xla_trace.hlo_dump(MODULE, prefix="step_ops_hlo_") as dump:  # before JAX's backend
        res = run(args.quick, args.beta, dump, args.model) | {"machine": common.machine_info()}
    common.write_json(args.out, res)
    print(table_markdown(res))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
