r"""Prompt sharing under the layer scan: one loop over the layers, or two passes.

With `algo.share_prompt` the step runs each micro-batch's distinct prompts once
and the rows over them (`models.prompt_sharing`). Under the layer `scan`
(`model.scan_layers`, the default) it does so in one scan whose every layer runs
the prompts and then the rows (`Transformer.forward_shared_prompt`); before, it
ran two calls, a prefill of the prompts into a stacked cache and a call of the
rows over it, each its own scan. On CPU, XLA copies a layer's weights out of the
stacked arrays in every scan step (docs/benchmarks.md, "The step on CPU,
profiled"), so the two calls paid those copies, forward and backward, twice.

One process builds a config's RL step twice from one train state, as
`make tune` does (the config's model, optimizer and micro-batches; a synthetic
batch at the prompt width asked for, every completion at the cap), and times the
two forms alternately, so machine noise between processes does not enter:

- ``one_loop``: the step as shipped;
- ``two_calls``: the same step traced with ``shared_prompt_hidden(one_loop=False)``.

Both take the same update from the same state: the first steps' losses and
gradient norms are compared (they may differ in the order of f32 sums, no more).

    python -m benchmarks.profile_shared_loop [--config smollm2_toolcall] \
        [--widths 240,16] [--steps 6] [--out docs/benchmarks/shared_loop_<kind>.json]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any

from benchmarks import common

DEFAULT_OUT = "runs/bench/shared_loop.json"
DEFAULT_CONFIG = "smollm2_toolcall"
FORMS = ("one_loop", "two_calls")


def _load_config(name: str) -> Any:
    """configs/<name>.py's get_config() ("name:arg": get_config(arg))."""
    import importlib

    module, _, arg = name.partition(":")
    get = importlib.import_module(f"configs.{module}").get_config
    return get(arg) if arg else get()


def _steps(cfg: Any, width: int) -> tuple[dict[str, Any], Any, Any, Any]:
    """The two forms' compiled steps over one train state, each run once (its
    trace and compile), and the state, batch and reference they run on."""
    import jax
    import jax.numpy as jnp

    from gdpo_jax.train import build, distributed
    from gdpo_jax.train import completion as completion_mod
    from gdpo_jax.train import mesh as mesh_lib
    from gdpo_jax.train import state as state_lib
    from gdpo_jax.train.step import CompiledStep, StepConfig
    from gdpo_jax.train.tune import synthetic_batch

    mesh = mesh_lib.make_mesh(tuple(cfg.mesh.shape), axis_types=cfg.mesh.axis_types)
    shards = mesh_lib.batch_axis_size(mesh)
    model, _ = build.build_model(cfg, mesh)
    arrays = synthetic_batch(cfg, cfg.algo.num_prompts, model.cfg.vocab_size, prompt_len=width)
    batch = distributed.to_global(arrays, mesh)
    sc = StepConfig.from_config(cfg, batch_shards=shards)
    if not sc.share_prompt:
        raise SystemExit(f"{cfg.algo.num_prompts} prompts: this config's step shares no prompt.")
    tx, schedule = state_lib.rl_optimizer(cfg, sc.updates_per_step)
    graphdef, state = state_lib.create_train_state(model, tx, mesh)
    ref = jax.tree.map(jnp.copy, state.params) if sc.needs_ref else None
    kw = dict(graphdef=graphdef, tx=tx, schedule=schedule, cfg=sc, mesh=mesh)
    kw["state_shardings"] = state_lib.shardings_of(state)
    shipped = completion_mod.shared_prompt_hidden
    steps, first = {}, {}
    for form in FORMS:
        if form == "two_calls":  # traced on its first call, while the patch is in place
            completion_mod.shared_prompt_hidden = functools.partial(shipped, one_loop=False)
        try:
            steps[form] = CompiledStep(**kw)
            t0 = time.perf_counter()
            # The same state into both: a step donates it, so each gets a copy.
            _, m = steps[form](jax.tree.map(jnp.copy, state), batch, ref)
            first[form] = {k: float(m[k]) for k in ("loss", "grad_norm")}
            first[form]["compile_s"] = time.perf_counter() - t0
        finally:
            completion_mod.shared_prompt_hidden = shipped
    built = {"steps": steps, "first": first, "layers": model.cfg.num_layers}
    return built, state, batch, ref


def _child(config: str, width: int, steps: int) -> dict[str, Any]:
    """One process: the two forms at one prompt width, timed alternately."""
    import jax

    from gdpo_jax.train.config import validated_copy

    # Validated on this process's devices (the workdir is never written).
    cfg = validated_copy(_load_config(config), common.scratch_dir("shared_loop_"))
    built, state, batch, ref = _steps(cfg, width)
    times: dict[str, list[float]] = {f: [] for f in FORMS}
    for _ in range(steps):
        for form in FORMS:
            t0 = time.perf_counter()
            state, m = built["steps"][form](state, batch, ref)
            jax.block_until_ready(m)
            times[form].append(time.perf_counter() - t0)
    out: dict[str, Any] = {"width": width, "steps_timed": steps, "first": built["first"]}
    for form, t in times.items():
        out |= {f"{form}_median_s": statistics.median(t), f"{form}_best_s": min(t)}
    out |= {
        "rows": int(cfg.algo.num_prompts * cfg.algo.group_size),
        "new_tokens": int(cfg.sampling.max_new_tokens),
        "microbatches": int(cfg.algo.num_microbatches),
        "layers": int(built["layers"]),
    }
    return out


def run(config: str, widths: tuple[int, ...], steps: int) -> dict[str, Any]:
    """Each width in a fresh process with the huge-page tunable (as bench_rl)."""
    rows = []
    for w in widths:
        args = ["--config", config, "--widths", str(w), "--steps", str(steps)]
        r = common.run_child("benchmarks.profile_shared_loop", args)
        r["speedup"] = r["two_calls_median_s"] / r["one_loop_median_s"]
        r["speedup_best"] = r["two_calls_best_s"] / r["one_loop_best_s"]
        rows.append(r)
    return {"benchmark": "profile_shared_loop", "config": config, "results": rows}


def table_markdown(res: dict[str, Any]) -> str:
    """The comparison's markdown table (docs/benchmarks.md)."""
    rows = []
    for r in res["results"]:
        a, b = r["first"]["one_loop"], r["first"]["two_calls"]
        rows.append(
            {
                "prompt width": r["width"],
                "step s, two calls (median)": f"{r['two_calls_median_s']:.2f}",
                "step s, one loop (median)": f"{r['one_loop_median_s']:.2f}",
                "speed-up (median / best)": f"{r['speedup']:.2f}x / {r['speedup_best']:.2f}x",
                "first loss: abs. diff": f"{abs(a['loss'] - b['loss']):.1e}",
                "first grad norm: rel. diff": f"{abs(a['grad_norm'] / b['grad_norm'] - 1):.1e}",
            }
        )
    r0, m = res["results"][0], res.get("machine", {})
    return (
        common.markdown_table(rows)
        + f"\n\n{m.get('cpu_model')} ({m.get('cpu_isa', '')}), {m.get('cpu_usable')} cores; "
        f"`{res['config']}`'s step ({r0['layers']} layers as a scan, {r0['rows']} rows, "
        f"{r0['new_tokens']} new tokens, micro-batches: {r0['microbatches']}, prompt sharing), "
        f"huge pages on; {r0['steps_timed']} steps of each form, alternating, one process "
        "per width."
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="a configs/ name (name[:arg])")
    ap.add_argument("--widths", default="240,16", help="comma-separated prompt widths")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per form")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--_child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        widths = tuple(int(w) for w in a.widths.split(","))
    except ValueError:
        ap.error(f"--widths={a.widths!r}: give comma-separated token counts, e.g. 240,16.")
    if not widths or min(widths) < 2:
        ap.error(f"--widths={a.widths!r}: every width needs at least 2 tokens.")
    if a.steps < 1:
        ap.error(f"--steps={a.steps}: time at least 1 step per form.")
    if a._child:
        common.write_json(a._child, _child(a.config, widths[0], a.steps))
        return
    try:
        cfg = _load_config(a.config)
    except (ImportError, AttributeError) as e:
        ap.error(f"--config={a.config!r}: not a configs/ file with get_config() ({e}).")
    if not cfg.model.scan_layers:
        ap.error(f"--config={a.config!r} runs its layers unrolled: both forms would be two calls.")
    if max(widths) > cfg.sampling.max_prompt_len:
        ap.error(
            f"--widths={a.widths!r}: {max(widths)} is wider than the config's "
            f"sampling.max_prompt_len={cfg.sampling.max_prompt_len}."
        )
    common.check_out(ap, a.out, "--out", is_dir=False)  # before the run
    res = run(a.config, widths, a.steps)
    common.publish(res, a.out, table_markdown)


if __name__ == "__main__":
    main()
