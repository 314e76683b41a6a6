r"""What a log-prob pass costs the RL step on XLA:CPU, and in which program.

Two passes can run either as a separate log-prob program before the step or
inside the step's micro-batch loop (``--pass``):

- ``ref``: at beta > 0 the KL term needs the reference policy's log-probs
  (`StepConfig.ref_logp_in_step`, on with one update per batch). The forms:
  ``none`` (beta 0, no reference pass: the baseline), ``separate`` (beta 0.04,
  the reference log-probs from the separate program) and ``in_step`` (beta 0.04,
  the reference forward inside the step). Inside the step the pass does the
  same FLOPs as the separate program.
- ``old``: with ``algo.old_logprobs="recompute"`` (the paper configs') the
  importance ratio's old log-probs are the policy's own before the update
  (`StepConfig.old_logp_in_step`, on with one update per batch: they equal
  stop_gradient of the step's own forward). The forms: ``none`` (the sampler's
  log-probs, bench_rl's default: no pass), ``separate`` (recomputed by the
  separate program, as with several updates per batch) and ``in_step`` (from
  the step's forward: no extra FLOPs), all at beta 0.

At bench_rl's layout (3M Llama, 64 rows, 4 micro-batches, layers unrolled,
prompt sharing), one process builds the three forms' trainers and times them
alternately: first whole RL iterations (sampling, rewards, the log-prob passes,
the step; the step's `time/step_s` too), then the step alone, back to back. Every
timed step is the RL loop's: it includes the pass, whichever program computes it.
Each form's cost over ``none`` is set beside a forward's model-FLOP share,
bench_rl.model_flops at beta 0.04 over beta 0, minus one: the forward's 2NT
against the step's 6NT + attention.

Each listed micro-batch count (repeats allowed) runs in a fresh process:

    python -m benchmarks.profile_ref --microbatches 4,4,4 \
        --out docs/benchmarks/profile_ref_<kind>.json
    python -m benchmarks.profile_ref --pass old --microbatches 4,4,4 \
        --out docs/benchmarks/profile_old_logp_<kind>.json
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


@dataclasses.dataclass(frozen=True)
class Pass:
    """One log-prob pass: how its forms are built and what the table calls them."""

    beta: float  # of the separate and in-step forms (the baseline runs beta 0)
    old_logprobs: str  # config.algo.old_logprobs of those two forms
    step_field: str  # the StepConfig switch between them
    none: str  # the baseline's column
    separate: str
    in_step: str
    added: str  # the in-step form's cost column


PASSES = {
    "ref": Pass(
        BETA,
        "sampler",
        "ref_logp_in_step",
        "beta 0, no reference: s (median)",
        "reference pass, then the step: s (median)",
        "reference forward in the step: s (median)",
        "in the step: added over beta 0",
    ),
    "old": Pass(
        0.0,
        "recompute",
        "old_logp_in_step",
        "sampler's log-probs, no pass: s (median)",
        "old log-prob pass, then the step: s (median)",
        "old log-probs from the step's forward: s (median)",
        "from the step: added over no pass",
    ),
}


def _with_in_step(trainer: Any, field: str, on: bool) -> None:
    """Rebuilds the trainer's step with the StepConfig switch `field` = on (off: the
    log-probs from the separate log-prob program, as with several updates)."""
    from gdpo_jax.train import state as state_lib
    from gdpo_jax.train.step import CompiledStep

    trainer.step_cfg = dataclasses.replace(trainer.step_cfg, **{field: on})
    trainer.step = CompiledStep(
        graphdef=trainer.graphdef,
        tx=trainer.tx,
        schedule=trainer.schedule,
        cfg=trainer.step_cfg,
        state_shardings=state_lib.shardings_of(trainer.state),
        mesh=trainer.mesh,
    )


def _child(microbatches: int, which: str = "ref") -> dict[str, Any]:
    """One process: the three forms' trainers, timed alternately (module docstring);
    {<form>_iter_median_s, <form>_iter_step_median_s, <form>_median_s, <form>_best_s}."""
    from benchmarks.profile_step import _alternate, _trainer

    ps = PASSES[which]
    pairs = {}
    for form in FORMS:
        beta, old = (0.0, "sampler") if form == "none" else (ps.beta, ps.old_logprobs)
        pairs[form] = _trainer(
            microbatches, beta, scan_layers=False, share_prompt=True, old_logprobs=old
        )
        if form != "none":
            _with_in_step(pairs[form][0], ps.step_field, form == "in_step")
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
    """A forward's model FLOPs over the beta-0 step's (bench_rl's count, at
    bench_rl's rows and full sequence length): the reference forward's, and the
    separate old log-prob pass's."""
    from benchmarks import bench_rl as B

    rows = B.TINY.prompts * B.TINY.generations
    seq = B.PROMPT_WORDS + 1 + B.TINY.new_tokens
    return B.model_flops(rows, seq, beta=BETA) / B.model_flops(rows, seq, beta=0.0) - 1.0


def run_variant(microbatches: int, which: str = "ref") -> dict[str, Any]:
    """One micro-batch count in a fresh process, with the huge-page tunable."""
    args = ["--microbatches", str(microbatches), "--pass", which]
    res = common.run_child("benchmarks.profile_ref", args)
    return {"microbatches": microbatches, "hugetlb": True, **res}


def run(microbatches: tuple[int, ...] = (4,), which: str = "ref") -> dict[str, Any]:
    """Every listed micro-batch count, each in a fresh process; a JSON-able dict."""
    rows = []
    for m in microbatches:
        r = run_variant(m, which)
        r["beta"], r["speedup"] = PASSES[which].beta, r["separate_median_s"] / r["in_step_median_s"]
        r["iter_speedup"] = r["separate_iter_median_s"] / r["in_step_iter_median_s"]
        rows.append(r)
    # The reference pass's runs keep their keys (committed JSONs, the docs' tests).
    share = {"reference_flop_share" if which == "ref" else "forward_flop_share": flop_share()}
    return {
        "benchmark": "profile_ref",
        "pass": which,
        "ab_steps_timed": STEPS,
        **share,
        f"{which}_ab": rows,
    }


_TIMINGS = (
    ("RL iteration", "iter_median_s"),
    ("its step (time/step_s)", "iter_step_median_s"),
    ("the step alone, back to back", "median_s"),
)


def table_markdown(res: dict) -> str:
    """The comparison's markdown table (docs/benchmarks.md). Runs with the baseline
    (`none_*`: beta 0, or the sampler's log-probs; the reference pass's since
    2026-12-05) add its column and the in-step form's measured cost over it,
    beside a forward's FLOP share."""
    which = res.get("pass", "ref")  # runs before --pass were the reference pass's
    ps = PASSES[which]
    rows = []
    for r in res.get(f"{which}_ab", []):
        for what, key in _TIMINGS:
            row = {
                "timed": what,
                "micro-batches": r["microbatches"],
                "beta": r["beta"],
            }
            if f"none_{key}" in r:
                row[ps.none] = f"{r[f'none_{key}']:.3f}"
            row |= {
                ps.separate: f"{r[f'separate_{key}']:.3f}",
                ps.in_step: f"{r[f'in_step_{key}']:.3f}",
                "speed-up": f"{r[f'separate_{key}'] / r[f'in_step_{key}']:.2f}x",
            }
            if f"none_{key}" in r:
                cost = r[f"in_step_{key}"] / r[f"none_{key}"] - 1.0
                row[ps.added] = f"{cost:+.0%}"
            rows.append(row)
    m = res.get("machine", {})
    text = (
        common.markdown_table(rows) + "\n\nbench_rl's layout (layers unrolled, prompt sharing), "
        f"{common.cpu_label(m)}; huge pages on; "
        f"{res.get('ab_steps_timed', '?')} of each (iterations, then steps), alternating, "
        "each micro-batch entry (its three rows) in a fresh process."
    )
    if "reference_flop_share" in res:
        text += (
            f" The reference forward's share of the beta-0 step's model FLOPs: "
            f"+{res['reference_flop_share']:.0%}."
        )
    if "forward_flop_share" in res:
        text += (
            f" The old log-prob pass's share (a forward) of the step's model FLOPs: "
            f"+{res['forward_flop_share']:.0%}."
        )
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--microbatches", default="4", help="comma-separated, repeats allowed")
    ap.add_argument(
        "--pass", dest="which", default="ref", choices=sorted(PASSES), help="module docstring"
    )
    ap.add_argument("--out", default="", help="default: runs/bench/profile_<pass>.json")
    ap.add_argument("--_child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._child:
        common.write_json(a._child, _child(int(a.microbatches), a.which))
        return
    out = a.out or f"runs/bench/profile_{a.which}.json"
    common.check_out(ap, out, "--out", is_dir=False)  # before the run
    try:
        mbs = tuple(int(x) for x in a.microbatches.split(","))
    except ValueError:
        ap.error(f"--microbatches={a.microbatches!r}: give comma-separated integers, e.g. 4,4,4.")
    res = run(mbs, a.which)
    res["machine"] = common.machine_info()
    print(table_markdown(res))
    print(f"wrote {common.write_json(out, res)}")


if __name__ == "__main__":
    main()
