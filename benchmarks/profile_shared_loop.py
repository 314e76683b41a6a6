r"""Prompt sharing's forward forms in a config's RL step: one loop over the
layers, two passes, every row its own prompt, or the layers unrolled.

With `algo.share_prompt` the step runs each micro-batch's distinct prompts once
and the rows over them (`models.prompt_sharing`). Under the layer `scan`
(`model.scan_layers`, the default) it does so in one scan whose every layer runs
the prompts and then the rows (`Transformer.forward_shared_prompt`); before, it
ran two calls, a prefill of the prompts into a stacked cache and a call of the
rows over it, each its own scan. On CPU, XLA copies a layer's weights out of the
stacked arrays in every scan step (docs/benchmarks.md, "The step on CPU,
profiled"), so the two calls paid those copies, forward and backward, twice.

One process builds a config's RL step in each form from one train state, as
`make tune` does (the config's model, optimizer and micro-batches; a synthetic
batch at the prompt width asked for, every completion at the cap), and times the
forms alternately, so machine noise between processes does not enter:

- ``one_loop``: the step as shipped (layer scan, prompt sharing);
- ``two_calls``: the same step traced with ``shared_prompt_hidden(one_loop=False)``;
- ``per_row``: the same step without prompt sharing (``StepConfig.share_prompt``
  off: every row runs its own copy of its prompt);
- ``unrolled``: the model rebuilt with ``model.scan_layers=False`` (its own train
  state, the same weights), sharing through its two calls.

All take the same update from the same weights: the first steps' losses and
gradient norms are compared with the one loop's (they may differ in the order of
f32 sums, no more). A form's first call traces, compiles and runs one step: its
seconds against the median step are what the form costs to start.

    python -m benchmarks.profile_shared_loop [--config smollm2_toolcall] \
        [--widths 240,16] [--forms one_loop,two_calls,per_row,unrolled] [--steps 6] \
        [--out docs/benchmarks/shared_loop_<kind>.json]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import statistics
import time
from typing import Any

from benchmarks import common

DEFAULT_OUT = "runs/bench/shared_loop.json"
DEFAULT_CONFIG = "smollm2_toolcall"
FORMS = ("one_loop", "two_calls", "per_row", "unrolled")
SHIPPED = "one_loop"  # every form is compared with it
LABELS = {
    "one_loop": "one loop (shipped)",
    "two_calls": "two calls",
    "per_row": "per row (no sharing)",
    "unrolled": "unrolled layers, sharing",
}


def _load_config(name: str) -> Any:
    """configs/<name>.py's get_config() ("name:arg": get_config(arg))."""
    import importlib

    module, _, arg = name.partition(":")
    get = importlib.import_module(f"configs.{module}").get_config
    return get(arg) if arg else get()


def _steps(
    cfg: Any, width: int, forms: tuple[str, ...] = FORMS
) -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
    """Each form's compiled step, run once (its trace and compile) from the same
    weights; returns ({"steps", "first", "layers"}, the train state each form
    steps on, the batch, the reference weights)."""
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
    sc = StepConfig.from_config(cfg, batch_shards=shards)
    if not sc.share_prompt:
        raise SystemExit(f"{cfg.algo.num_prompts} prompts: this config's step shares no prompt.")
    tx, schedule = state_lib.rl_optimizer(cfg, sc.updates_per_step)

    def train_state(scan_layers: bool) -> tuple[Any, Any, Any]:
        c = copy.deepcopy(cfg)
        with c.unlocked():
            c.model.scan_layers = scan_layers
        model, _ = build.build_model(c, mesh)
        graphdef, state = state_lib.create_train_state(model, tx, mesh)
        return model, graphdef, state

    model, graphdef, state = train_state(True)
    arrays = synthetic_batch(cfg, cfg.algo.num_prompts, model.cfg.vocab_size, prompt_len=width)
    batch = distributed.to_global(arrays, mesh)
    ref = jax.tree.map(jnp.copy, state.params) if sc.needs_ref else None
    states = {f: state for f in forms if f != "unrolled"}
    graphdefs = {f: graphdef for f in states}
    scan = {f: bool(model.cfg.scan_layers) for f in states}
    if "unrolled" in forms:
        unrolled, graphdefs["unrolled"], states["unrolled"] = train_state(False)
        scan["unrolled"] = bool(unrolled.cfg.scan_layers)
    shipped = completion_mod.shared_prompt_hidden
    steps, first = {}, {}
    for form in forms:
        kw = dict(graphdef=graphdefs[form], tx=tx, schedule=schedule, mesh=mesh)
        kw["state_shardings"] = state_lib.shardings_of(states[form])
        kw["cfg"] = dataclasses.replace(sc, share_prompt=False) if form == "per_row" else sc
        if form == "two_calls":  # traced on its first call, while the patch is in place
            completion_mod.shared_prompt_hidden = functools.partial(shipped, one_loop=False)
        try:
            steps[form] = CompiledStep(**kw)
            t0 = time.perf_counter()
            # The same weights into every form: a step donates its state, so each
            # first call gets a copy.
            _, m = steps[form](jax.tree.map(jnp.copy, states[form]), batch, ref)
            first[form] = {k: float(m[k]) for k in ("loss", "grad_norm")}
            first[form]["first_call_s"] = time.perf_counter() - t0
            # What the form ran, from the objects that ran it.
            first[form]["share_prompt"] = bool(steps[form].cfg.share_prompt)
            first[form]["scan_layers"] = scan[form]
        finally:
            completion_mod.shared_prompt_hidden = shipped
    built = {"steps": steps, "first": first, "layers": model.cfg.num_layers}
    return built, states, batch, ref


def _child(config: str, width: int, steps: int, forms: tuple[str, ...] = FORMS) -> dict[str, Any]:
    """One process: the forms at one prompt width, timed alternately."""
    import jax

    from gdpo_jax.train.config import validated_copy

    # Validated on this process's devices (the workdir is never written).
    cfg = validated_copy(_load_config(config), common.scratch_dir("shared_loop_"))
    built, states, batch, ref = _steps(cfg, width, forms)
    times: dict[str, list[float]] = {f: [] for f in forms}
    scan_state = None  # the scan forms step one state in turn
    for _ in range(steps):
        for form in forms:
            state = states[form] if form == "unrolled" or scan_state is None else scan_state
            t0 = time.perf_counter()
            state, m = built["steps"][form](state, batch, ref)
            jax.block_until_ready(m)
            times[form].append(time.perf_counter() - t0)
            if form == "unrolled":
                states[form] = state
            else:
                scan_state = state
    out: dict[str, Any] = {"width": width, "steps_timed": steps, "forms": {}}
    for form, t in times.items():
        out["forms"][form] = built["first"][form] | {
            "median_s": statistics.median(t),
            "best_s": min(t),
        }
    out |= {
        "rows": int(cfg.algo.num_prompts * cfg.algo.group_size),
        "new_tokens": int(cfg.sampling.max_new_tokens),
        "microbatches": int(cfg.algo.num_microbatches),
        "layers": int(built["layers"]),
    }
    return out


def repaid_after(form: dict[str, float], base: dict[str, float]) -> float | None:
    """Steps after which a form that starts slower (first call) but steps faster
    (median) than `base` has made up its start: the first-call difference over the
    per-step saving; None when it does not both start slower and step faster."""
    start = form["first_call_s"] - base["first_call_s"]
    saved = base["median_s"] - form["median_s"]
    return start / saved if start > 0 and saved > 0 else None


def run(
    config: str, widths: tuple[int, ...], steps: int, forms: tuple[str, ...] = FORMS
) -> dict[str, Any]:
    """Each width in a fresh process with the huge-page tunable (as bench_rl); each
    form's median and best step over the one loop's (above 1: the one loop is faster)."""
    rows = []
    for w in widths:
        args = ["--config", config, "--widths", str(w), "--steps", str(steps)]
        r = common.run_child("benchmarks.profile_shared_loop", args + ["--forms", ",".join(forms)])
        base = r["forms"][SHIPPED]
        for f in r["forms"].values():
            f["vs_shipped"] = f["median_s"] / base["median_s"]
            f["vs_shipped_best"] = f["best_s"] / base["best_s"]
            f["repaid_after_steps"] = repaid_after(f, base)
        rows.append(r)
    return {"benchmark": "profile_shared_loop", "config": config, "results": rows}


def table_markdown(res: dict[str, Any]) -> str:
    """The comparison's markdown table (docs/benchmarks.md): one row per width and form."""
    rows = []
    for r in res["results"]:
        base = r["forms"][SHIPPED]
        for form, f in r["forms"].items():
            rows.append(
                {
                    "prompt width": r["width"],
                    "form": LABELS[form],
                    "step s (median)": f"{f['median_s']:.2f}",
                    "step s (best)": f"{f['best_s']:.2f}",
                    "its step over the one loop's (median / best)": (
                        f"{f['vs_shipped']:.2f}x / {f['vs_shipped_best']:.2f}x"
                    ),
                    "first call s": f"{f['first_call_s']:.1f}",
                    "repaid after steps": (
                        "-" if f["repaid_after_steps"] is None else f"{f['repaid_after_steps']:.0f}"
                    ),
                    "first loss: abs. diff": f"{abs(f['loss'] - base['loss']):.1e}",
                    "first grad norm: rel. diff": (
                        f"{abs(f['grad_norm'] / base['grad_norm'] - 1):.1e}"
                    ),
                }
            )
    r0, m = res["results"][0], res.get("machine", {})
    return (
        common.markdown_table(rows) + f"\n\n{common.cpu_label(m)}; "
        f"`{res['config']}`'s step ({r0['layers']} layers, {r0['rows']} rows, "
        f"{r0['new_tokens']} new tokens, micro-batches: {r0['microbatches']}), huge pages on; "
        f"{r0['steps_timed']} steps of each form, alternating, one process per width; "
        "first call: trace, compile and one step; repaid after: the steps after which a form "
        "that starts slower but steps faster than the one loop has made up its start; diffs "
        "against the one loop's first step."
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="a configs/ name (name[:arg])")
    ap.add_argument("--widths", default="240,16", help="comma-separated prompt widths")
    ap.add_argument("--forms", default=",".join(FORMS), help="comma-separated forms")
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
    forms = tuple(dict.fromkeys(f for f in a.forms.split(",") if f))
    if SHIPPED not in forms or not set(forms) <= set(FORMS):
        ap.error(
            f"--forms={a.forms!r}: name {SHIPPED} (the baseline) and any of {', '.join(FORMS[1:])}."
        )
    if a.steps < 1:
        ap.error(f"--steps={a.steps}: time at least 1 step per form.")
    if a._child:
        common.write_json(a._child, _child(a.config, widths[0], a.steps, forms))
        return
    try:
        cfg = _load_config(a.config)
    except (ImportError, AttributeError) as e:
        ap.error(f"--config={a.config!r}: not a configs/ file with get_config() ({e}).")
    if not cfg.model.scan_layers:
        ap.error(
            f"--config={a.config!r} runs its layers unrolled: the scan forms would be two calls."
        )
    if max(widths) > cfg.sampling.max_prompt_len:
        ap.error(
            f"--widths={a.widths!r}: {max(widths)} is wider than the config's "
            f"sampling.max_prompt_len={cfg.sampling.max_prompt_len}."
        )
    common.check_out(ap, a.out, "--out", is_dir=False)  # before the run
    res = run(a.config, widths, a.steps, forms)
    common.publish(res, a.out, table_markdown)


if __name__ == "__main__":
    main()
