r"""Where the RL step's time goes on XLA:CPU: bench_rl's step under variants.

The step of benchmarks/bench_rl.py (3M Llama, 64 rows x 73 tokens, GDPO,
beta 0), with its layers as one lax.scan (the model default; bench_rl runs them
unrolled, the A/B at the end) and without prompt sharing (bench_rl shares
prompts), is timed alone (one jitted call, no sampling),
for each variant of
micro-batch count x glibc's huge-page malloc tunable (gdpo_jax/hostenv.py),
each in a fresh process. Per variant: median / best seconds of 12 steps,
minor page faults per step (fresh 4 KiB pages the kernel zero-fills), and,
with --trace, the milliseconds per step of the largest kinds of XLA:CPU
operation (durations summed), from a
jax.profiler trace (ynn_fusion = YNNPACK matmuls, copy_* = layout copies such
as the transposes before weight-gradient matmuls, wrapped_broadcast = zero
fills of scan buffers, dynamic-update-slice / dynamic-slice = the layer
scan's stacking and slicing).

Then, per micro-batch count (with the tunable), one process builds the step
twice, with autodiff's own weight gradients and with gdpo_jax/core/dense.py's
(xᵀ materialized before each dW = xᵀ dY), and times the two alternately:
machine noise between processes is larger than the difference. Likewise, per
micro-batch count and beta (0, 0.04), the layers as one lax.scan vs unrolled
(config.model.scan_layers).

With ``--model smollm2`` (a bench_rl.SHAPES key) only that scan-vs-unrolled
comparison runs, on bench_rl's SmolLM2-135M-sized trainer and batch (4 x 4
rows, 64 new tokens), AB_STEPS_LARGE steps of each per beta.

    python -m benchmarks.profile_step [--microbatches 1,4] [--trace] \
        [--out runs/bench/profile_step.json]
    python -m benchmarks.profile_step --model smollm2 --microbatches 4 --out r.json

What the reference pass (beta > 0) and the recomputed old log-probs cost, and in which
program: profile_ref.py.
Every timed step is the RL loop's: at beta > 0 it includes the reference
log-probs, whichever program computes them (the runs committed before 2026-12-03
timed the step with them precomputed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import common
from benchmarks.xla_trace import op_breakdown

STEPS = 12
AB_STEPS = 12
AB_STEPS_LARGE = 6  # per side, for a model other than bench_rl's tiny one (seconds per step)


def _trainer(
    microbatches: int,
    beta: float,
    scan_layers: bool = True,
    model: str = "tiny",
    share_prompt: bool = False,
    old_logprobs: str = "sampler",
    remat: str = "off",
) -> tuple[Any, dict]:
    """bench_rl's trainer (1 device) and one collected batch, ready for `trainer.step`;
    model: a bench_rl.SHAPES key (the Llama and the batch); share_prompt: bench_rl's
    prompt sharing (off: the per-row forward of the committed profiles); old_logprobs:
    config.algo.old_logprobs (bench_rl's "sampler", or "recompute"); remat: "off", or
    the config.model.remat_policy to rematerialize the layers with ("full", "dots")."""
    from benchmarks import bench_rl as B
    from gdpo_jax.rewards import register_reward
    from gdpo_jax.tasks import TaskData
    from gdpo_jax.train import distributed
    from gdpo_jax.train.config import base_config
    from gdpo_jax.train.loop import Trainer

    for fn in B.REWARDS:
        register_reward(f"bench_{fn.__name__}")(fn)
    c = base_config()
    c.workdir = common.scratch_dir("profile_step_")
    shape = B.SHAPES[model]
    c.model.name = B.make_checkpoint(common.scratch_dir("profile_ckpt_"), shape)
    c.model.scan_layers = scan_layers
    if remat != "off":
        c.model.remat, c.model.remat_policy = True, remat
    c.task.name, c.task.chat_template = "toolcall", False
    c.rewards.names = tuple(f"bench_{fn.__name__}" for fn in B.REWARDS)
    c.rewards.num_workers = 1
    c.algo.estimator, c.algo.beta, c.algo.kl_estimator = "gdpo", beta, "k3"
    c.algo.group_size, c.algo.num_prompts = shape.generations, shape.prompts
    c.algo.aggregation, c.algo.num_microbatches = "grpo", microbatches
    c.algo.old_logprobs = old_logprobs
    # By default the per-row forward, as in the committed profiles: prompt sharing
    # (bench_rl's default since) changes the row layout per micro-batch count;
    # bench_prompt_sharing times it against this form.
    c.algo.share_prompt = share_prompt
    c.sampling.max_new_tokens, c.sampling.max_prompt_len = shape.new_tokens, B.PROMPT_WORDS + 1
    c.mesh.num_devices, c.train.num_steps, c.train.progress_bar = 1, 10, False
    records = [{"prompt": p} for p in B.prompts(64, vocab=shape.vocab)]
    trainer = Trainer(c, task=TaskData(train=records, eval=[]))
    arrays, _ = trainer._collect(0)
    return trainer, trainer.logprob_passes(distributed.to_global(arrays, trainer.mesh))


def _step_seconds(trainer: Any, batch: dict) -> float:
    """One step as the RL loop runs it, with the log-prob passes it runs before
    (`Trainer.logprob_passes`)."""
    import jax

    t0 = time.perf_counter()
    batch = trainer.logprob_passes(batch)
    trainer.state, m = trainer.step(trainer.state, batch, trainer.ref_params)
    jax.block_until_ready(m)
    return time.perf_counter() - t0


def _child(microbatches: int, beta: float, trace_dir: str) -> dict[str, Any]:
    """Runs in the variant's own process: build bench_rl's trainer, time the step."""
    import resource

    import jax

    trainer, batch = _trainer(microbatches, beta)
    _step_seconds(trainer, batch), _step_seconds(trainer, batch)
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = [_step_seconds(trainer, batch) for _ in range(STEPS)]
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / STEPS
    out: dict[str, Any] = {
        "median_s": statistics.median(times),
        "best_s": min(times),
        "minor_faults_per_step": faults,
    }
    if trace_dir:
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        for _ in range(2):
            _step_seconds(trainer, batch)
        jax.profiler.stop_trace()
        out["op_ms_per_step"] = op_breakdown(trace_dir, steps=2)
    trainer.runner.close()
    return out


def _alternate(
    pairs: Sequence[tuple[Any, dict]], names: Sequence[str], steps: int = AB_STEPS
) -> dict:
    """Times built (trainer, batch) pairs in turn, `steps` steps each (two untimed
    calls first), closes them; {<name>_median_s, <name>_best_s}."""
    for pair in pairs:
        _step_seconds(*pair), _step_seconds(*pair)
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(steps):
        for name, pair in zip(names, pairs, strict=True):
            times[name].append(_step_seconds(*pair))
    for trainer, _ in pairs:
        trainer.runner.close()
    out = {f"{n}_median_s": statistics.median(t) for n, t in times.items()}
    return out | {f"{n}_best_s": min(t) for n, t in times.items()}


def _child_weight_grad_ab(microbatches: int, beta: float) -> dict[str, Any]:
    """One process, two steps (autodiff's weight gradients, core.dense's), timed
    alternately. The step traces on its first call, so each trainer's first call
    happens while its lowering is in place."""
    from gdpo_jax.core import dense as dense_mod

    ours = dense_mod._dense_cpu
    dense_mod._dense_cpu = dense_mod._einsum  # autodiff's gradient of the plain einsum
    plain = _trainer(microbatches, beta)
    _step_seconds(*plain)
    dense_mod._dense_cpu = ours
    dense = _trainer(microbatches, beta)
    return _alternate([plain, dense], ("autodiff", "dense"))


def _child_scan_layers_ab(microbatches: int, beta: float, model: str = "tiny") -> dict[str, Any]:
    """One process, two steps (layers as one lax.scan, layers unrolled:
    config.model.scan_layers), timed alternately."""
    scan = _trainer(microbatches, beta, scan_layers=True, model=model)
    unrolled = _trainer(microbatches, beta, scan_layers=False, model=model)
    steps = AB_STEPS if model == "tiny" else AB_STEPS_LARGE
    return _alternate([scan, unrolled], ("scan", "unrolled"), steps)


def run_variant(
    microbatches: int, tunable: bool, beta: float, trace: bool, ab: str = "", model: str = "tiny"
) -> dict[str, Any]:
    """One variant in a fresh process (the tunable only acts from process start);
    `ab`: an alternating comparison instead, "weight_grad" (_child_weight_grad_ab),
    or "scan_layers" (_child_scan_layers_ab, for bench_rl.SHAPES[model])."""
    args = ["--microbatches", str(microbatches), "--beta", str(beta)]
    if ab:
        args += ["--_ab", ab, "--model", model]
    with tempfile.TemporaryDirectory() as tmp:
        if trace:
            args += ["--_trace_dir", os.path.join(tmp, "trace")]
        res = common.run_child("benchmarks.profile_step", args, hugetlb=tunable)
    return {"microbatches": microbatches, "hugetlb": tunable, **res}


def _scan_ab_rows(microbatches: tuple[int, ...], model: str) -> list[dict[str, Any]]:
    """The scan-vs-unrolled A/B per micro-batch count and beta (0, 0.04), with speed-ups."""
    rows = []
    for m in microbatches:
        for beta in (0.0, 0.04):
            r = run_variant(m, True, beta, False, ab="scan_layers", model=model)
            r["beta"], r["speedup"] = beta, r["scan_median_s"] / r["unrolled_median_s"]
            rows.append(r)
    return rows


def run_scan_ab(model: str, microbatches: tuple[int, ...] = (4,)) -> dict:
    """Only the scan-vs-unrolled comparison, for a bench_rl.SHAPES model; a JSON-able
    dict (its table: scan_table_markdown)."""
    return {
        "benchmark": "profile_step",
        "model": model,
        "ab_steps_timed": AB_STEPS_LARGE,
        "scan_layers_ab": _scan_ab_rows(microbatches, model),
    }


def run(quick: bool = False, microbatches: tuple[int, ...] = (1, 4), trace: bool = False) -> dict:
    """Every (micro-batches, tunable) variant; a JSON-able dict."""
    mbs = microbatches[:1] if quick else microbatches
    rows = [run_variant(m, tunable, 0.0, trace) for m in mbs for tunable in (False, True)]
    ab = [run_variant(m, True, 0.0, False, ab="weight_grad") for m in mbs]
    for r in ab:
        r["speedup"] = r["autodiff_median_s"] / r["dense_median_s"]
    return {
        "benchmark": "profile_step",
        "steps_timed": STEPS,
        "results": rows,
        "ab_steps_timed": AB_STEPS,
        "weight_grad_ab": ab,
        "scan_layers_ab": _scan_ab_rows(mbs, "tiny"),
    }


def table_markdown(res: dict) -> str:
    """The markdown table of a run (docs/benchmarks.md shows the committed run's)."""
    kinds: list[str] = []
    for r in res["results"]:
        kinds += [k for k in r.get("op_ms_per_step", {}) if k not in kinds][:4]
    kinds = kinds[:5]
    head = ["micro-batches", "huge pages", "step s (median)", "minor faults / step"]
    lines = ["| " + " | ".join(head + [f"{k} ms" for k in kinds]) + " |"]
    lines.append("|" + "---|" * (len(head) + len(kinds)))
    for r in res["results"]:
        ops = r.get("op_ms_per_step", {})
        cells = [
            str(r["microbatches"]),
            "yes" if r["hugetlb"] else "no",
            f"{r['median_s']:.3f}",
            f"{r['minor_faults_per_step']:,.0f}",
        ] + [f"{ops[k]:.0f}" if k in ops else "-" for k in kinds]
        lines.append("| " + " | ".join(cells) + " |")
    m = res.get("machine", {})
    if m:
        lines.append(
            f"\n{common.cpu_label(m)}; "
            f"{res['steps_timed']} timed steps per variant; operation columns: the largest "
            "kinds, ms per step from the trace (the trace slows a step a little)."
        )
    return "\n".join(lines)


def _ab_table(res: dict, rows: list[dict]) -> str:
    lines = [common.markdown_table(rows)]
    model, m = res.get("model", "tiny"), res.get("machine", {})
    where = (
        f"bench_rl's `{model}` shape, {common.cpu_label(m)}; huge" if model != "tiny" else "Huge"
    )
    lines.append(
        f"\n{where} pages on; {res.get('ab_steps_timed', '?')} steps of each, alternating, "
        "in one process per row."
    )
    return "\n".join(lines)


def ab_table_markdown(res: dict) -> str:
    """The weight-gradient comparison's markdown table (docs/benchmarks.md)."""
    rows = [
        {
            "micro-batches": r["microbatches"],
            "autodiff's weight gradient: step s (median)": f"{r['autodiff_median_s']:.3f}",
            "core.dense's: step s (median)": f"{r['dense_median_s']:.3f}",
            "speed-up": f"{r['speedup']:.2f}x",
        }
        for r in res.get("weight_grad_ab", [])
    ]
    return _ab_table(res, rows)


def scan_table_markdown(res: dict) -> str:
    """The scan-vs-unrolled layers comparison's markdown table (docs/benchmarks.md)."""
    rows = [
        {
            "micro-batches": r["microbatches"],
            "beta": r["beta"],
            "layers as one scan: step s (median)": f"{r['scan_median_s']:.3f}",
            "unrolled (model.scan_layers=False): step s (median)": f"{r['unrolled_median_s']:.3f}",
            "speed-up": f"{r['speedup']:.2f}x",
        }
        for r in res.get("scan_layers_ab", [])
    ]
    return _ab_table(res, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--microbatches", default="1,4")
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--trace", action="store_true", help="add the per-operation breakdown")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--model",
        default="tiny",
        choices=("tiny", "smollm2"),
        help="a bench_rl.SHAPES key; other than tiny, only the scan-vs-unrolled comparison runs",
    )
    ap.add_argument("--out", default="runs/bench/profile_step.json")
    ap.add_argument("--_child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--_trace_dir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--_ab", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    common.check_out(ap, a.out, "--out", is_dir=False)  # before the run
    if a._child:
        if a._ab:
            child = {
                "weight_grad": _child_weight_grad_ab,
                "scan_layers": _child_scan_layers_ab,
            }
            kw = {"model": a.model} if a._ab == "scan_layers" else {}
            res = child[a._ab](int(a.microbatches), a.beta, **kw)
        else:
            res = _child(int(a.microbatches), a.beta, a._trace_dir)
        with open(a._child, "w") as f:
            json.dump(res, f)
        return
    mbs = tuple(int(x) for x in a.microbatches.split(","))
    if a.model != "tiny":
        res = run_scan_ab(a.model, mbs)
        res["machine"] = common.machine_info()
        print(scan_table_markdown(res))
        print(f"wrote {common.write_json(a.out, res)}")
        return
    res = run(a.quick, mbs, a.trace)
    res["machine"] = common.machine_info()
    cols = ["microbatches", "hugetlb", "median_s", "best_s", "minor_faults_per_step"]
    print(common.text_table([{k: r[k] for k in cols} for r in res["results"]]))
    for r in res["results"]:
        if "op_ms_per_step" in r:
            ops = ", ".join(f"{k} {v}" for k, v in r["op_ms_per_step"].items())
            print(f"mb={r['microbatches']} hugetlb={r['hugetlb']}: ms/step {ops}")
    print(table_markdown(res))
    print(ab_table_markdown(res))
    print(scan_table_markdown(res))
    print(f"wrote {common.write_json(a.out, res)}")


if __name__ == "__main__":
    main()
