"""The planner's figures against a run on the devices at hand.

`plan.make_plan` compiles a run's programs for a target it need not have and
predicts, per device, the memory each program needs and a roofline time. This
module runs the same programs on the accelerators of this machine and measures
both, so a plan can be checked before a pod is booked on its word:

  * the model is the planned architecture (`arch.model_config`: names, never
    weights), randomly initialized and placed as a run places it, with its
    optimizer state (and the reference weights when the step needs them);
  * the inputs are synthetic at the config's widest shapes (`tune.synthetic_batch`;
    the sampler decodes every row to ``sampling.max_new_tokens``: no stop id is
    ever sampled);
  * one program per call of `measure_program`, in fresh processes
    (`experiments.check_plan`): one compiles it into a persistent compilation
    cache, the next loads it from there and runs it. A device's peak-memory
    counter cannot be reset, and compiling has a peak of its own (the GPU
    autotuner's scratch), so each peak is read in a process that did only that.

Peak memory is the devices' own counter (``memory_stats()["peak_bytes_in_use"]``,
the largest over local devices; None where the backend keeps none, e.g. CPU).
It counts everything the process placed on the device, the resident state
included, which is what the plan's per-program total counts too.

    m = measure_program(cfg, "step", steps=3)  # {"peak_bytes", "median_s", ...}
    rows = compare(plan, {"step": m})
    print(format_comparison(rows))
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
from flax import nnx

from gdpo_jax.scale.arch import PlanError, model_config
from gdpo_jax.scale.memory import memory_figures
from gdpo_jax.scale.plan import config_digest
from gdpo_jax.scale.targets import GIB, parse_target

__all__ = [
    "check_matches",
    "compare",
    "format_comparison",
    "measure_program",
    "peak_bytes",
]

PROGRAMS = ("step", "logprob", "generate")
# Platform names: a plan's target ("cuda") and JAX's backend ("gpu").
_BACKEND = {"cuda": "gpu", "tpu": "tpu"}


def peak_bytes(key: str = "peak_bytes_in_use") -> int | None:
    """The largest of a memory counter over this process's devices (default the peak
    bytes in use; "bytes_in_use": held now). None where the backend keeps none."""
    stats = [d.memory_stats() for d in jax.local_devices()]
    if not all(s and key in s for s in stats):
        return None
    return max(int(s[key]) for s in stats)


def _timed(fn, steps: int) -> dict[str, Any]:
    """Calls fn() once (compile + run) and `steps` times more; fn blocks on its result."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return dict(
        first_call_s=first,
        times_s=times,
        median_s=statistics.median(times),
        best_s=min(times),
    )


def _generate_inputs(cfg, args, rows: int, vocab: int, seed: int) -> tuple:
    """Concrete inputs for `lowering.generate_program`'s ShapeDtypeStructs: random
    prompts, `rows` active rows of the padded call (G per prompt), no eos / stop id
    (eos -1 is never sampled: every row decodes to the cap, the planned worst case)."""
    rng = np.random.default_rng(seed)
    g = int(cfg.algo.group_size)
    ids_sds, mask_sds, row_prompt, active, key, temp, top_p, eos, stop, seqs, limit, row_ids = args
    b = row_prompt.shape[0]

    def put(x, sds):
        return jax.device_put(jnp.asarray(x, sds.dtype), sds.sharding)

    u, p = ids_sds.shape
    return (
        put(rng.integers(6, vocab, (u, p)), ids_sds),
        put(np.ones((u, p)), mask_sds),
        put(np.minimum(np.arange(b) // g, u - 1), row_prompt),
        put(np.arange(b) < rows, active),
        jax.device_put(jax.random.key(seed), key.sharding),
        put(cfg.sampling.temperature, temp),
        put(cfg.sampling.top_p, top_p),
        put(np.full(eos.shape, -1), eos),
        put(np.zeros(stop.shape), stop),
        put(np.zeros(seqs.shape), seqs),
        put(np.full((b,), int(cfg.sampling.max_new_tokens)), limit),
        put(np.arange(b), row_ids),
    )


def measure_program(
    cfg: mlc.ConfigDict,
    program: str,
    *,
    steps: int = 3,
    plan: dict[str, Any] | None = None,
    any_platform: bool = False,
    compile_only: bool = False,
) -> dict[str, Any]:
    """Runs one of the planned programs ("step", "logprob", "generate") of `cfg` on
    this process's devices (module docstring) and measures it. With `plan`, first
    checks that the plan is of this config on these devices (`check_matches`).

    compile_only: compile the program and measure that instead of running it.
    Compiling has a peak of its own (XLA's GPU autotuner runs candidate kernels on
    scratch buffers as large as a matmul's output), so `experiments.check_plan`
    compiles in one process into a persistent compilation cache and runs in
    another that loads the program from it: each peak is then its own.

    Returns {"program", "resident_bytes" (held before the program: weights,
    optimizer state, inputs; None where the backend keeps no counter, as for the
    peaks), "setup_peak_bytes" (the peak before the program), and
    compile_only: "compile_s", "compile_peak_bytes", "compiled" (this device's
    compiler's args / outputs / aliased / temps bytes, to set beside the plan's,
    compiled for the target elsewhere); else: "first_call_s", "times_s",
    "median_s", "best_s", "peak_bytes"; and "num_params", "mesh",
    "rows_per_call" (generate), "backend", "device_kind", "devices"}.
    """
    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.scale.lowering import generate_program
    from gdpo_jax.train import distributed
    from gdpo_jax.train import mesh as mesh_lib
    from gdpo_jax.train import state as state_lib
    from gdpo_jax.train.config import validated_copy
    from gdpo_jax.train.step import CompiledStep, StepConfig
    from gdpo_jax.train.tune import synthetic_batch

    if program not in PROGRAMS:
        raise ValueError(f"program={program!r}: one of {PROGRAMS}.")
    if steps < 1:
        raise ValueError(f"steps={steps}: time at least 1 call.")
    user_cfg, cfg = cfg, validated_copy(cfg, "/tmp/gdpo_check_plan")  # workdir never written
    devices = jax.devices()[: cfg.mesh.num_devices or None]
    mesh = mesh_lib.make_mesh(
        tuple(cfg.mesh.shape), axis_types=cfg.mesh.axis_types, devices=devices
    )
    if plan is not None:
        check_matches(plan, user_cfg, mesh, any_platform=any_platform)
    mc = model_config(cfg)
    model = create_model(mc, mesh=mesh, seed=int(cfg.seed))
    num_params = int(sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model))))
    sc = StepConfig.from_config(cfg, batch_shards=mesh_lib.batch_axis_size(mesh))
    tx, schedule = state_lib.rl_optimizer(cfg, sc.updates_per_step)
    graphdef_full = nnx.graphdef(model)
    graphdef, state = state_lib.create_train_state(model, tx, mesh)
    # The reference weights sit beside every program of a run that needs them
    # (held to the end of this function), and are the step's argument when it
    # computes the reference log-probs itself.
    ref = jax.tree.map(jnp.copy, state.params) if sc.needs_ref else None
    out: dict[str, Any] = dict(program=program)
    if program == "generate":
        rows = int(cfg.sampling.rows_per_call) or cfg.algo.num_prompts * cfg.algo.group_size
        model_state = nnx.state(nnx.merge(graphdef, state.params))
        fn, args, b, _, call_mesh = generate_program(cfg, graphdef_full, None, mesh, rows)
        inputs = _generate_inputs(cfg, args[1:], rows, mc.vocab_size, int(cfg.seed))
        if call_mesh is None:  # the Sampler's one-device call: weights as plain arrays
            model_state = jax.device_put(model_state, args[1].sharding)

        def ctx():
            return jax.set_mesh(call_mesh) if call_mesh is not None else contextlib.nullcontext()

        def call():
            with ctx():
                jax.block_until_ready(fn(model_state, *inputs))

        def lower():
            with ctx():
                return fn.lower(model_state, *inputs)

        out["rows_per_call"] = b
    else:
        arrays = synthetic_batch(
            cfg, cfg.algo.num_prompts // jax.process_count(), mc.vocab_size, seed=int(cfg.seed)
        )
        batch = distributed.to_global(arrays, mesh)
        step = CompiledStep(
            graphdef=graphdef,
            tx=tx,
            schedule=schedule,
            cfg=sc,
            state_shardings=state_lib.shardings_of(state),
            mesh=mesh,
        )
        if program == "step":
            holder = [state]

            def call():  # the step donates its state: carry the new one
                holder[0], metrics = step(holder[0], batch, ref)
                jax.block_until_ready(metrics)

            def lower():
                return step.lower(holder[0], batch, ref)
        else:

            def call():
                jax.block_until_ready(step.logprobs(state.params, batch))

            def lower():
                return step.lower_logprobs(state.params, batch)

    out.update(resident_bytes=peak_bytes("bytes_in_use"), setup_peak_bytes=peak_bytes())
    if compile_only:
        t0 = time.perf_counter()
        out["compiled"] = memory_figures(lower().compile())
        out.update(compile_s=time.perf_counter() - t0, compile_peak_bytes=peak_bytes())
    else:
        out.update(_timed(call, steps))
        out["peak_bytes"] = peak_bytes()
    out.update(
        num_params=num_params,
        mesh=dict(mesh.shape),
        backend=jax.default_backend(),
        device_kind=devices[0].device_kind,
        devices=len(devices),
    )
    return out


def check_matches(
    plan: dict[str, Any], cfg: mlc.ConfigDict, mesh: Any, *, any_platform: bool = False
) -> None:
    """Raises PlanError (one line, naming the fix) unless `plan` planned what `cfg` runs
    on `mesh` here: the same platform (unless any_platform), device count, mesh and
    programs (`plan.config_digest`)."""
    want, have = _BACKEND.get(plan["platform"], plan["platform"]), jax.default_backend()
    if have != want and not any_platform:
        raise PlanError(
            f"the plan is for {plan['target']} ({plan['platform']}) but this machine runs "
            f"{have}: plan for a topology of this machine's devices (e.g. "
            "--topology=1xh200), or pass --any_platform to compare anyway."
        )
    if plan["num_devices"] != mesh.devices.size or plan["mesh"] != dict(mesh.shape):
        raise PlanError(
            f"the plan is for {plan['num_devices']} devices, mesh {plan['mesh']}, but this run "
            f"has {mesh.devices.size}, mesh {dict(mesh.shape)}: plan for a topology of this "
            "machine's devices with the same --config.mesh.* flags."
        )
    if "config_digest" not in plan:
        raise PlanError(
            "the plan has no config_digest (an older planner made it): plan again with "
            "python -m experiments.plan --json=<path>."
        )
    if plan["config_digest"] != config_digest(cfg):
        raise PlanError(
            "the plan was made for other config values than these (its config_digest differs): "
            "plan and measure with the same --config flags."
        )


def compare(plan: dict[str, Any], measured: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measured program: the plan's memory and roofline time beside the
    measurement.

    planned_bytes: the plan's per-device total (program + resident state);
    measured_peak_bytes: the device's peak while the program ran (loaded from the
    compilation cache), compile_peak_bytes: while it compiled (with the state
    resident, as in a run; None when not measured);
    planned_temps / device_temps: the program's temporaries as the plan's compiler
    (for the target) and this device's compiler put them;
    roofline_s: the plan's lower bound for one call (the step: "train", plus
    the log-prob passes it runs itself; one log-prob pass: "logprob" / all the
    log-prob passes of a step, `step_shape.logprob_passes`; one sampler call:
    prefill + decode over the step's calls); mfu: the phase's FLOPs over the
    measured median time and the target's peak (all devices); memory_ratio and
    time_ratio: measured / planned.
    """
    target = parse_target(plan["target"])
    peak = target.chip.peak_flops * plan["num_devices"]
    roof, fl = plan["roofline"], plan["flops"]
    gen = plan["programs"].get("generate", {})
    # Calls per step as the roofline counts them: the configured rows per call
    # (step_shape), not the call's rows padded to the batch shards (programs.generate).
    rpc = plan.get("step_shape", {}).get("rows_per_call") or gen.get("rows_per_call")
    n_calls = -(-plan["rows"] // rpc) if gen else 1
    passes = plan.get("step_shape", {}).get("logprob_passes", 0)  # old + reference, all programs
    rows = []
    for name, m in measured.items():
        p = plan["programs"][name]
        if name == "step":
            # Plus the log-prob forwards the step runs itself (the reference's with
            # StepConfig.ref_logp_in_step): their share of the roofline's passes.
            share = p.get("logprob_passes", 0) / max(passes, 1)
            secs = roof["train"] + share * roof["logprob"]
            flops = fl["train"] + share * fl["logprob"]
        elif name == "logprob":  # one pass of the roofline's (those in the step too)
            runs = passes or p.get("runs_per_step", 1)
            secs, flops = roof["logprob"] / runs, fl["logprob"] / runs
        else:
            secs = (roof["prefill"] + roof["decode"]) / n_calls
            flops = (fl["prefill"] + fl["decode"]) / n_calls
        peak_b, setup_b = m.get("peak_bytes"), m.get("setup_peak_bytes")
        rows.append(
            dict(
                program=name,
                planned_bytes=int(p["total_bytes"]),
                measured_peak_bytes=peak_b,
                # The peak was set before the program ran (setup): its own is at most that.
                peak_is_setup=peak_b is not None and setup_b is not None and peak_b <= setup_b,
                planned_temps=int(p["temps"]),
                device_temps=m["compiled"]["temps"] if m.get("compiled") else None,
                memory_ratio=None if peak_b is None else peak_b / p["total_bytes"],
                compile_peak_bytes=m.get("compile_peak_bytes"),
                roofline_s=float(secs),
                measured_s=float(m["median_s"]),
                time_ratio=float(m["median_s"]) / secs if secs else None,
                mfu=float(flops) / (float(m["median_s"]) * peak),
                compile_s=m.get("compile_s"),
            )
        )
    return rows


def format_comparison(rows: list[dict[str, Any]]) -> str:
    """`compare`'s rows as a markdown table."""

    def gib(x):
        return "n/a" if x is None else f"{x / GIB:.2f}"

    def ratio(x):
        return "n/a" if x is None else f"{x:.2f}"

    out = [
        "| program | planned GiB | measured peak GiB | measured / planned | peak compiling GiB "
        "| temporaries GiB: plan / this device's compiler | roofline s | measured s (median) "
        "| measured / roofline | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        at_most = "<= " if r.get("peak_is_setup") else ""  # the setup's peak, not the program's
        out.append(
            f"| {r['program']} | {gib(r['planned_bytes'])} | {at_most}"
            f"{gib(r['measured_peak_bytes'])} | {ratio(r['memory_ratio'])} | "
            f"{gib(r.get('compile_peak_bytes'))} | "
            f"{gib(r['planned_temps'])} / {gib(r.get('device_temps'))} | {r['roofline_s']:.3f} | "
            f"{r['measured_s']:.3f} | {ratio(r['time_ratio'])} | {r['mfu']:.1%} |"
        )
    return "\n".join(out)
