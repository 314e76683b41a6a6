"""Ahead-of-time plan of a run on a target: every program compiled, memory per device.

    plan = make_plan(cfg, parse_target("v5p-16"))
    plan["fits"], plan["peak_gib"], plan["peak_program"], plan["programs"]["step"]

For the target's abstract devices (targets.py) and the config's own mesh,
shapes and shardings, with abstract params (never materialized; lowering.py
builds the abstract inputs and lowerings), it compiles the programs a training
run executes:

  step          the fused RL step (CompiledStep): advantages, all updates
  logprob       the log-prob pass (CompiledStep.logprobs), run for the old
                policy (algo.old_logprobs="recompute") and/or the reference
                (beta / kl_in_reward > 0): one program, run once or twice;
                none where the step computes both itself (one update per
                batch: StepConfig.old_logp_in_step / ref_logp_in_step)
  generate      the sampler's prefill + while-loop decode (decode.py), for
                sampling.rows_per_call rows per call

Per program and device: the compiler's argument / output / alias / temporary
bytes, plus the state resident beside the program but not an argument of it
(the optimizer state while sampling, the reference weights...), which is what
must fit in the chip's memory (`Target.usable_bytes`). TPU: a program over
HBM fails to compile (RESOURCE_EXHAUSTED) and is reported as not fitting, and
program + beside is compared with the HBM libtpu makes available; GPU
compilers never refuse, so the total is compared with the pool of a run with
XLA_PYTHON_CLIENT_MEM_FRACTION=0.95, at most the card less
GPU_RUNTIME_RESERVE_BYTES.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections as mlc
from flax import nnx

from gdpo_jax.models.attention import attention_kind
from gdpo_jax.models.config import ModelConfig
from gdpo_jax.scale import flops as flops_lib
from gdpo_jax.scale.arch import PlanError, model_config
from gdpo_jax.scale.lowering import _generate_lowering, abstract_step, continuous_prompt_slots
from gdpo_jax.scale.memory import compile_memory, per_device_bytes
from gdpo_jax.scale.report import format_plan
from gdpo_jax.scale.targets import GIB, Target, target_devices
from gdpo_jax.train import mesh as mesh_lib

PROGRAMS = ("step", "logprob", "generate")
# Config fields each program's compiled code depends on (a search re-compiles only those).
_COMMON = ("model.", "mesh.")
_DEPENDS = {
    "step": (
        "algo.",
        "sampling.max_prompt_len",
        "sampling.max_new_tokens",
        "sampling.temperature",
        "rewards.names",
        "rewards.weights",
        "optim.",
    ),
    "logprob": (
        "algo.num_prompts",
        "algo.group_size",
        "algo.num_minibatches",
        "algo.num_microbatches",
        "algo.logprob_chunk_size",
        "algo.share_prompt",  # each prompt's forward once per group (StepConfig.shared_group)
        "algo.beta",
        "algo.kl_in_reward",
        "sampling.max_prompt_len",
        "sampling.max_new_tokens",
        "sampling.temperature",
    ),
    "generate": ("algo.num_prompts", "algo.group_size", "sampling."),
}
_CACHE: dict[tuple, dict] = {}


def _key(name: str, cfg, target: Target) -> tuple:
    flat = _flat(json.loads(cfg.to_json()))
    deps = _COMMON + _DEPENDS[name]
    rel = {k: v for k, v in flat.items() if any(k == d or k.startswith(d) for d in deps)}
    return name, target.name, json.dumps(rel, sort_keys=True)


# Fields added to the config after plans were committed, with the value that compiles
# what the config without them did: at that value they stay out of the digest, so the
# committed plans (and their check, tests/test_docs.py) hold.
_ADDED_FIELDS = {
    "algo.nan_rewards": "omit",
    "algo.kl_in_reward_estimator": "k1",
    "optim.decay_mask": "all",
    "model.remat_policy": "full",
}


def config_digest(cfg: mlc.ConfigDict) -> str:
    """A digest of the config fields some planned program depends on (`_DEPENDS`; not
    mesh.num_devices, which the target sets): equal digests plan the same programs."""
    flat = _flat(json.loads(cfg.to_json()))
    flat = {k: v for k, v in flat.items() if k not in _ADDED_FIELDS or v != _ADDED_FIELDS[k]}
    deps = _COMMON + tuple(d for ds in _DEPENDS.values() for d in ds)
    rel = {
        k: v
        for k, v in flat.items()
        if k != "mesh.num_devices" and any(k == d or k.startswith(d) for d in deps)
    }
    return hashlib.sha256(json.dumps(rel, sort_keys=True).encode()).hexdigest()[:16]


def _flat(d: dict, pre: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{pre}{k}.") if isinstance(v, dict) else {f"{pre}{k}": v})
    return out


def make_plan(cfg: mlc.ConfigDict, target: Target, *, devices: list | None = None) -> dict:
    """The plan of `cfg` on `target` (see the module docstring). Validates the config first.

    Kernels are chosen for the target's platform, not the CPU host's (e.g.
    model.attention="auto" lowers cuDNN flash attention for a GPU target in bf16,
    as a run on that GPU would).
    """
    from gdpo_jax.backend import target_backend

    with target_backend(target.platform):
        return _make_plan(cfg, target, devices=devices)


def _cudnn_on_host() -> bool:
    """Whether cuDNN can be loaded here (lowering its attention kernel needs it)."""
    try:
        from jax._src.cudnn.fused_attention_stablehlo import check_cudnn_version

        check_cudnn_version()
        return True
    except Exception:  # noqa: BLE001 - not installed / no CUDA plugin: any failure means no
        return False


def _attention_for_host(mc: ModelConfig, requested: str) -> tuple[ModelConfig, str]:
    """The model config to lower (inside target_backend) and a note for the plan.

    A GPU target in bf16 runs cuDNN flash attention (model.attention="auto"); lowering
    it needs cuDNN on the planning host. Without it, "auto" is planned with the XLA
    kernel and the plan says so; an explicit "cudnn" is an error naming the fix.
    """
    try:
        kind = attention_kind(mc)
    except ValueError as e:  # a kernel's limits (cuDNN's head dims): one line, no traceback
        raise PlanError(str(e)) from None
    if kind != "cudnn" or _cudnn_on_host():
        return mc, f"attention kernel: {kind}"
    if requested == "cudnn":
        raise PlanError(
            "config.model.attention='cudnn': lowering cuDNN flash attention needs cuDNN on "
            "this host (pip install nvidia-cudnn-cu12); or plan --config.model.attention=auto."
        )
    note = (
        "attention kernel: xla (a bf16 run on this GPU uses cuDNN flash attention, which is "
        "not installed on this host: its temporaries are planned for the XLA kernel)"
    )
    return dataclasses.replace(mc, attention="xla"), note


def _copy_itemsize(dtype: Any, compute_dtype: Any) -> int:
    """Bytes per element of a weight in the unrolled decode forms' copy
    (`sampling.decode.weights_in`: floating arrays in the compute dtype)."""
    floating = jnp.issubdtype(dtype, jnp.floating)
    return jnp.dtype(compute_dtype if floating else dtype).itemsize


def _sampler_memory(cfg, mc: ModelConfig, mesh, rows: int, share: int, full_b: int, params_b: int):
    """The sampler program's KV cache per device and how it decodes.

    Static decode: each device's rows hold their new slots plus their prompt's
    (a G-shared prompt counts 1/G per row), kv heads split over "tensor" where
    they divide (`flops.kv_head_shards`).
    Continuous batching (``sampling.continuous_slots`` = B): each batch shard
    decodes min(B, its rows) lanes of P + M slots, each lane holding a copy of
    its row's prompt (or of M slots, beside min(W, lanes) shared prompt slots
    of P: ``sampling.continuous_prompt_slots`` = W), beside the prefilled cache
    of the window of prompts its rows read; on several devices the program runs
    per shard with the weights gathered whole (every kv head on every device),
    so the gathered weights (the full params, `full_b` bytes, less the device's
    own shard, `params_b`) are part of its temporaries. Returns
    {"kv_cache_bytes", "decode", and for continuous batching "slots",
    "lanes_per_shard", "prompt_slots_per_shard", "gathered_params_bytes"}.
    """
    s, g = cfg.sampling, cfg.algo.group_size
    shards = mesh_lib.batch_axis_size(mesh)
    plen, m = int(s.max_prompt_len), int(s.max_new_tokens)
    per_head = 2 * mc.num_layers * mc.head_dim * jnp.dtype(mc.dtype).itemsize  # k, v per token
    slots = int(s.get("continuous_slots", 0))
    if not slots:
        kv_heads = mc.num_kv_heads // flops_lib.kv_head_shards(
            mc.num_kv_heads, dict(mesh.shape)["tensor"]
        )
        kv = (rows // shards) * per_head * kv_heads * (plen / share + m)
        return dict(kv_cache_bytes=int(kv), decode="static")
    local = rows // shards
    lanes = min(slots, local)
    several = mesh.devices.size > 1
    window = min(rows // g, -(-local // g) + 1) if several else rows // g  # continuous._sharded
    w = min(continuous_prompt_slots(cfg), lanes)  # shared prompt slots, or 0: copies
    own = lanes * (m if w else plen + m)
    kv = per_head * mc.num_kv_heads * (own + w * plen + window * plen)
    return dict(
        kv_cache_bytes=int(kv),
        decode="continuous",
        slots=slots,
        lanes_per_shard=lanes,
        prompt_slots_per_shard=w,
        gathered_params_bytes=int(full_b - params_b) if several else 0,
    )


def _make_plan(cfg: mlc.ConfigDict, target: Target, *, devices: list | None = None) -> dict:
    from gdpo_jax.train.config import validate_config
    from gdpo_jax.train.step import CompiledStep

    if cfg.mesh.num_devices and cfg.mesh.num_devices != target.num_devices:
        # It was set to 0 here: the plan covered every device, where the run would
        # put its rows on the first num_devices (a memory underestimate).
        from gdpo_jax.errors import ConfigError

        raise ConfigError(
            f"config.mesh.num_devices={cfg.mesh.num_devices}, but a plan covers all "
            f"{target.num_devices} devices of the target; set --config.mesh.num_devices=0 "
            f"or plan a topology of {cfg.mesh.num_devices} devices."
        )
    digest = config_digest(cfg)
    cfg = copy.deepcopy(cfg)
    with cfg.unlocked():
        cfg.workdir = cfg.workdir or "/tmp/gdpo_plan"  # never written; validation wants one
        cfg.mesh.num_devices = 0
    # One JAX process per host: the run checks its processes' shares of prompts and rows.
    validate_config(cfg, num_devices=target.num_devices, num_processes=target.num_hosts)
    mc, attention_note = _attention_for_host(model_config(cfg), cfg.model.attention)
    devices = devices if devices is not None else target_devices(target)
    mesh = mesh_lib.make_mesh(
        tuple(cfg.mesh.shape), axis_types=cfg.mesh.axis_types, devices=devices
    )
    run = abstract_step(cfg, mc, mesh)
    step, state, batch, sc = run.step, run.state, run.batch, run.sc
    rows = int(cfg.sampling.rows_per_call) or cfg.algo.num_prompts * cfg.algo.group_size
    gen_lower, gen_rows, gen_spec = _generate_lowering(
        cfg, nnx.graphdef(run.model), run.full_state, mesh, rows
    )
    share = max(gen_spec.group, 1)  # rows reading one prompt's cache (sampling.share_prompt_cache)

    params_b = per_device_bytes(state.params)
    opt_b = per_device_bytes(state.opt_state)
    batch_b = per_device_bytes(batch)
    ref_b = params_b if sc.needs_ref else 0
    # Log-prob forwards per step: the old policy's (unless the step's own forward
    # gives them) and the reference's; those the step does not run itself are
    # the separate log-prob program's runs.
    old_lp = int(cfg.algo.old_logprobs == "recompute" and not sc.old_logp_in_step)
    n_fwd = old_lp + int(sc.needs_ref)
    n_lp = old_lp + int(sc.needs_ref and not sc.ref_logp_in_step)
    # The step's arguments include the reference weights when it runs their forward.
    ref_arg = state.params if sc.ref_logp_in_step else None
    kv_tok = 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * jnp.dtype(mc.dtype).itemsize
    full_b = sum(  # all params, unsharded
        math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(state.params)
    )
    decode_b = None  # the scan reads the stored weights; the unrolled forms a copy
    if gen_spec.layers != "scan":
        decode_b = sum(
            math.prod(x.shape) * _copy_itemsize(x.dtype, mc.dtype)
            for x in jax.tree.leaves(state.params)
        )
    sampler = _sampler_memory(cfg, mc, mesh, gen_rows, share, full_b, params_b)
    kv_b = sampler.pop("kv_cache_bytes")
    if sampler.get("prompt_slots_per_shard"):  # the lanes read W prompts' slots per step
        share = sampler["lanes_per_shard"] / sampler["prompt_slots_per_shard"]

    # name -> (lowering, bytes resident beside it that are not its arguments, breakdown)
    progs = {
        "step": (
            lambda: step.lower(state, batch, ref_arg),
            0 if sc.ref_logp_in_step else ref_b,
            dict(params=params_b, optimizer=opt_b, batch=batch_b, ref_params=ref_b),
        ),
        "generate": (
            gen_lower,
            opt_b + ref_b,
            dict(params=params_b, optimizer=opt_b, ref_params=ref_b, kv_cache=kv_b),
        ),
    }
    if n_lp:
        # Beside it: the optimizer state, the reference weights and the batch arrays
        # that are not its arguments (the ids and masks it reads are).
        lp_args_b = per_device_bytes({k: batch[k] for k in CompiledStep.LOGPROB_KEYS})
        progs["logprob"] = (
            lambda: step.lower_logprobs(state.params, batch),
            opt_b + ref_b + batch_b - lp_args_b,
            dict(params=params_b + ref_b, optimizer=opt_b, batch=batch_b),
        )
    limit = target.usable_bytes
    programs: dict[str, dict] = {}
    for name, (lower, resident, breakdown) in progs.items():
        key = _key(name, cfg, target)
        if key not in _CACHE:
            _CACHE[key] = compile_memory(lower)
        r = dict(_CACHE[key])
        total = r["program_bytes"] + resident
        r.update(
            resident_bytes=resident,
            total_bytes=total,
            fits=bool(r["compiler_fits"] and total <= limit),
            breakdown={**breakdown, "temporaries": r["temps"]},
        )
        r.update(
            {
                f"{k}_gib": v / GIB
                for k, v in (
                    ("total", total),
                    ("temp", r["temps"]),
                    ("args", r["args"]),
                    ("outputs", r["outputs"]),
                    ("aliased", r["aliased"]),
                )
            }
        )
        if name == "generate":
            r.update(rows_per_call=gen_rows, decode_layers=gen_spec.layers, **sampler)
            # Both decodes grow their cache in these phases (continuous batching too).
            r.update(decode_growth=gen_spec.growth, decode_phases=len(gen_spec.chunks))
        if name == "logprob":
            r["runs_per_step"] = n_lp
        if name == "step":  # the log-prob forwards it runs itself (the reference's)
            r["logprob_passes"] = n_fwd - n_lp
        programs[name] = r
    # A program the compiler refused binds, whatever the (lower bound) bytes it names.
    peak = max(programs, key=lambda k: (not programs[k]["compiled"], programs[k]["total_bytes"]))

    shape = flops_lib.StepShape(
        rows=cfg.algo.num_prompts * cfg.algo.group_size,
        prompts=cfg.algo.num_prompts,
        rows_per_call=rows,  # as configured: the step's rows / it calls, each of gen_rows
        prompt_len=cfg.sampling.max_prompt_len,
        new_tokens=cfg.sampling.max_new_tokens,
        logprob_passes=n_fwd,
        epochs=cfg.algo.num_epochs,
        remat=bool(mc.remat),
        remat_policy=mc.remat_policy,
        micro_batches=sc.num_epochs * sc.num_minibatches * sc.num_microbatches,
        param_bytes=int(full_b),
        kv_bytes_per_token=kv_tok,
        prompt_share=share,
        train_prompt_share=max(sc.shared_group, 1),
        decode_param_bytes=decode_b,
        decode_chunks=tuple(int(c) for c in gen_spec.chunks),
        batch_shards=mesh_lib.batch_axis_size(mesh),
        tensor=int(dict(mesh.shape)["tensor"]),
        sampler_weights_whole=bool(sampler.get("gathered_params_bytes")),
        logprob_chunk_size=int(sc.logprob_chunk_size),
        decode_lanes=int(sampler.get("lanes_per_shard", 0)),
    )
    fl = flops_lib.step_flops(mc, shape)
    roof = flops_lib.roofline(
        mc,
        shape,
        num_devices=target.num_devices,
        peak_flops=target.chip.peak_flops,
        hbm_bw=target.chip.hbm_bw,
    )
    return {
        "target": target.name,
        "device": target.describe(),
        "platform": target.platform,
        "num_devices": target.num_devices,
        "num_hosts": target.num_hosts,
        "mesh": dict(mesh.shape),
        "rows": int(cfg.algo.num_prompts * cfg.algo.group_size),
        "config_digest": digest,
        "model": cfg.model.name or "random-init (model.tiny)",
        "attention": mc.attention if mc.attention != "auto" else attention_kind(mc),
        "attention_note": attention_note,
        "num_params": int(sum(math.prod(x.shape) for x in jax.tree.leaves(state.params))),
        "device_memory_gib": target.chip.memory_bytes / GIB,
        "usable_gib": limit / GIB,
        "fits": all(p["fits"] for p in programs.values()),
        "peak_gib": programs[peak]["total_bytes"] / GIB,
        "peak_program": peak,
        "programs": programs,
        "step_flops": fl["total"],
        "flops": fl,
        "est_step_s": roof["total"],
        "roofline": roof,
        "step_shape": dataclasses.asdict(shape),  # the roofline's inputs (search re-estimates)
        "per_device": dict(
            params=params_b, optimizer=opt_b, batch=batch_b, ref_params=ref_b, kv_cache=kv_b
        ),
    }


__all__ = [
    "PROGRAMS",
    "PlanError",
    "config_digest",
    "format_plan",
    "make_plan",
    "model_config",
]
