r"""What rematerializing the layers costs bench_rl's step on XLA:CPU, by policy.

`model.remat` re-runs each layer's forward in the backward; `model.remat_policy`
names what it keeps all the same: "full" the layer's input alone (every weight
product but the down projection re-runs), "dots" also the weight products'
outputs (only the norms, RoPE, attention and gating re-run). One process per
row builds bench_rl's trainer (profile_step's: its model and batch, GDPO, beta 0,
prompts shared as bench_rl runs them) three times, without remat and with each
policy, and times their steps alternately (the step as the RL loop runs it);
rows: the layers as one scan (the model default) and unrolled (bench_rl's), at
bench_rl's 4 micro-batches and at 1. ``--model smollm2`` runs bench_rl's
SmolLM2-135M-sized trainer instead (4 x 4 rows; micro-batches of one group).

    python -m benchmarks.profile_remat [--model tiny|smollm2] [--microbatches 4,1] \
        [--steps 12] [--out docs/benchmarks/remat_<kind>.json]
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks import common

DEFAULT_OUT = "runs/bench/remat.json"
FORMS = ("off", "full", "dots")  # no remat, then each config.model.remat_policy
LAYERS = ("scan", "unrolled")


def _child(microbatches: int, layers: str, steps: int, model: str = "tiny") -> dict[str, Any]:
    """One process: the three forms' trainers, their steps timed alternately."""
    from benchmarks import profile_step as P

    scan = layers == "scan"
    pairs = [
        P._trainer(microbatches, 0.0, scan_layers=scan, model=model, share_prompt=True, remat=form)
        for form in FORMS
    ]
    return P._alternate(pairs, FORMS, steps)


def run(microbatches: tuple[int, ...], steps: int, model: str = "tiny") -> dict[str, Any]:
    """Each (micro-batches, layers) row in a fresh process with the huge-page tunable;
    each policy's median step over no remat's (above 1: remat is slower)."""
    rows = []
    for m in microbatches:
        for layers in LAYERS:
            args = ["--microbatches", str(m), "--steps", str(steps), "--_layers", layers]
            args += ["--model", model]
            r = common.run_child("benchmarks.profile_remat", args)
            r |= {"microbatches": m, "layers": layers}
            for form in FORMS[1:]:
                r[f"{form}_vs_off"] = r[f"{form}_median_s"] / r["off_median_s"]
            rows.append(r)
    return {"benchmark": "profile_remat", "model": model, "steps_timed": steps, "results": rows}


def table_markdown(res: dict[str, Any]) -> str:
    """The comparison's markdown table (docs/benchmarks.md)."""
    rows = [
        {
            "micro-batches": r["microbatches"],
            "layers": r["layers"],
            "no remat: step s (median)": f"{r['off_median_s']:.3f}",
            "remat full: step s (median)": f"{r['full_median_s']:.3f}",
            "remat dots: step s (median)": f"{r['dots_median_s']:.3f}",
            "full / no remat": f"{r['full_vs_off']:.2f}x",
            "dots / no remat": f"{r['dots_vs_off']:.2f}x",
        }
        for r in res["results"]
    ]
    m = res.get("machine", {})
    return (
        common.markdown_table(rows) + f"\n\n{common.cpu_label(m)}; "
        f"bench_rl's `{res.get('model', 'tiny')}` step (prompts shared, beta 0), huge pages on; "
        f"{res['steps_timed']} steps "
        "of each form, alternating, one process per row; above 1x remat is slower."
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", choices=("tiny", "smollm2"))
    ap.add_argument("--microbatches", default="4,1", help="comma-separated counts")
    ap.add_argument("--steps", type=int, default=12, help="timed steps per form")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--_child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--_layers", default="scan", choices=LAYERS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        counts = tuple(int(m) for m in a.microbatches.split(","))
    except ValueError:
        ap.error(f"--microbatches={a.microbatches!r}: give comma-separated counts, e.g. 4,1.")
    from benchmarks.rl_setup import SHAPES

    prompts = SHAPES[a.model].prompts  # shared prompts: whole groups per micro-batch
    if not counts or min(counts) < 1 or any(prompts % m for m in counts):
        ap.error(
            f"--microbatches={a.microbatches!r}: each count must divide the "
            f"{a.model} shape's {prompts} prompts (whole groups per micro-batch)."
        )
    if a.steps < 1:
        ap.error(f"--steps={a.steps}: time at least 1 step per form.")
    if a._child:
        common.write_json(a._child, _child(counts[0], a._layers, a.steps, a.model))
        return
    common.check_out(ap, a.out, "--out", is_dir=False)  # before the run
    common.publish(run(counts, a.steps, a.model), a.out, table_markdown)


if __name__ == "__main__":
    main()
