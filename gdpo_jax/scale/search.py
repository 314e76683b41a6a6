"""When a plan does not fit: the smallest change of the knobs a user would turn;
when it fits: the fewest micro-batches that still fit (`fewest_microbatches`).

Candidates are single changes, ordered from the cheapest in step time to the
dearest, aimed at the program that does not fit (the static decode's two knobs
by their roofline, `estimate`: more calls read the weights more often, one
phase reads more KV slots per step; which costs less depends on the shapes):

  generate  sampling.continuous_slots halved (continuous batching: fewer lanes
            per batch shard, each holding a prompt copy and P + M slots);
            sampling.rows_per_call halved (more, smaller sampler calls);
            sampling.decode_phases=1 (a decode whose phases grow by copies,
            sampling.decode_growth=copy, static or continuous: one cache of all
            slots from the start instead of the last phase's copy beside the
            one before; every step then reads the empty slots too, which for
            long completions costs more than more calls; "prefix" growth
            already holds one cache)
  step      model.remat on keeping the weight products (remat_policy=dots),
            then re-running whole layers (full); algo.logprob_chunk_size on / halved;
            algo.num_microbatches doubled (fewer rows per device at a time);
            algo.share_prompt off (per-row rows hold no repeated prompt K/V,
            and on the einsum path no [T, P + C] scores; it saves the most time)
  logprob   the same knobs as the step
  any       mesh.shape with every device on fsdp, then a tensor axis of 2, 4, 8

Each candidate must pass validate_config for the target; it is planned (only
the programs whose inputs it changes are re-compiled, see plan._DEPENDS) and
the first that fits is returned. If no single change fits, the search goes on
greedily: the lowest-peak candidate of a round is the next round's base, plus
one more change, up to 3 knobs (or until `max_tries` plans).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import ml_collections as mlc

from gdpo_jax.sampling.decode import decode_chunks
from gdpo_jax.scale import flops as flops_lib
from gdpo_jax.scale.arch import model_config
from gdpo_jax.scale.plan import make_plan
from gdpo_jax.scale.targets import Target
from gdpo_jax.train.config import ConfigError, check_mesh, validate_config


def _get(cfg: mlc.ConfigDict, path: str) -> Any:
    node: Any = cfg
    for part in path.split("."):
        node = node[part]
    return node


def _apply(cfg: mlc.ConfigDict, changes: dict[str, Any]) -> mlc.ConfigDict:
    c = copy.deepcopy(cfg)
    with c.unlocked():
        for path, value in changes.items():
            *parents, leaf = path.split(".")
            node = c
            for p in parents:
                node = node[p]
            node[leaf] = value
    return c


def _override(path: str, value: Any) -> str:
    if isinstance(value, tuple):
        value = "'(" + ",".join(str(v) for v in value) + ")'"
    return f"--config.{path}={value}"


def estimate(cfg: mlc.ConfigDict, plan: dict, target: Target) -> float:
    """Roofline seconds per step of `cfg`, a sampler-knob change of the config
    `plan` was made for, from the plan's step shape (no compile): the rows per
    call and the decode phases are read from `cfg`, the rest from the plan (its
    batch shards pad each call's rows, as the plan's own roofline counts them)."""
    shape = flops_lib.StepShape(**plan["step_shape"])
    s = cfg.sampling
    m = int(s.max_new_tokens)
    shape = dataclasses.replace(
        shape,
        rows_per_call=int(s.rows_per_call) or shape.rows,
        decode_chunks=decode_chunks(m, int(s.get("decode_phases", 0)) or None),
    )
    slots = int(s.get("continuous_slots", 0))  # lanes: at most a call's rows per shard
    lanes = min(slots, shape.call_rows // shape.batch_shards) if slots else 0
    shape = dataclasses.replace(shape, decode_lanes=lanes)
    chip = target.chip
    return flops_lib.roofline(
        model_config(cfg),
        shape,
        num_devices=target.num_devices,
        peak_flops=chip.peak_flops,
        hbm_bw=chip.hbm_bw,
    )["total"]


def candidates(
    cfg: mlc.ConfigDict,
    binding: str,
    num_devices: int,
    cost: Callable[[mlc.ConfigDict], float] | None = None,
    growth: str = "copy",
) -> list[dict[str, Any]]:
    """Single-knob changes, most promising for `binding` (the program over memory)
    first; `cost` (e.g. `estimate`) orders the static decode's knobs, else the
    row halvings come before one phase. `growth`: the planned decode's
    ``DecodeSpec.growth``; one phase saves memory only over "copy"."""
    a, s = cfg.algo, cfg.sampling
    rows = a.num_prompts * a.group_size
    out: list[dict[str, Any]] = []
    rpc = int(s.rows_per_call) or rows
    sampler = [
        {"sampling.rows_per_call": rpc // d}
        for d in (2, 4, 8, 16)
        if rpc // d >= a.group_size and (rpc // d) % a.group_size == 0
    ]
    slots = int(s.get("continuous_slots", 0))
    m = int(s.max_new_tokens)
    phased = len(decode_chunks(m, int(s.get("decode_phases", 0)) or None)) > 1
    if phased and growth == "copy":  # continuous batching's cache grows in phases too
        sampler.append({"sampling.decode_phases": 1})
    if cost is not None and not slots:
        sampler.sort(key=lambda change: cost(_apply(cfg, change)))  # stable: ties keep order
    if slots:
        # Halve the lanes, not the setting: slots above a shard's rows decode those rows
        # all the same, and halving them there recompiled an identical program.
        try:
            data, fsdp, _ = check_mesh(cfg, num_devices)
            slots = min(slots, max(-(-rpc // (data * fsdp)), 1))
        except ConfigError:  # the candidates' own validation reports the mesh
            pass
    sampler = [
        {"sampling.continuous_slots": slots // d} for d in (2, 4, 8) if slots // d >= 1
    ] + sampler
    train: list[dict[str, Any]] = []
    # Remat keeping the weight products ("dots": re-runs the attention) costs less step
    # time than re-running whole layers ("full"), and saves less memory.
    if not cfg.model.remat:
        train.append({"model.remat": True, "model.remat_policy": "dots"})
        train.append({"model.remat": True, "model.remat_policy": "full"})
    elif cfg.model.get("remat_policy", "full") != "full":
        train.append({"model.remat_policy": "full"})
    chunk = int(a.logprob_chunk_size)
    train += [
        {"algo.logprob_chunk_size": c}
        for c in ((512, 256) if not chunk else (chunk // 2, chunk // 4))
        if c >= 16
    ]
    train += [{"algo.num_microbatches": a.num_microbatches * k} for k in (2, 4, 8, 16)]
    if a.get("share_prompt", False):
        train.append({"algo.share_prompt": False})
    mesh = []
    for shape in ((1, -1, 1), (1, -1, 2), (1, -1, 4), (1, -1, 8)):
        if tuple(cfg.mesh.shape) != shape and num_devices % abs(shape[0] * shape[2]) == 0:
            mesh.append({"mesh.shape": shape})
    out = sampler + train if binding == "generate" else train + sampler
    return out + mesh


def _valid(cfg: mlc.ConfigDict, target: Target) -> bool:
    """Whether `cfg` passes validation on `target`, and its mesh splits over the target's
    slices (make_plan refuses a mesh whose data and fsdp axes both miss the slice count:
    a candidate validation passed aborted the whole search)."""
    c = copy.deepcopy(cfg)
    with c.unlocked():
        c.workdir = c.workdir or "/tmp/gdpo_plan"
        c.mesh.num_devices = 0
    try:
        validate_config(c, num_devices=target.num_devices, num_processes=target.num_hosts)
        data, fsdp, _ = check_mesh(c, target.num_devices)
    except ConfigError:
        return False
    return target.num_slices == 1 or not (data % target.num_slices and fsdp % target.num_slices)


def _plan_try(
    cfg: mlc.ConfigDict,
    target: Target,
    changes: dict[str, Any],
    log: Callable[[str], None] | None,
) -> dict:
    """make_plan of `cfg` (the config with `changes` applied), logged as one try."""
    p = make_plan(cfg, target)
    if log:
        log(
            f"  try {' '.join(_override(k, v) for k, v in changes.items())}: "
            f"peak {p['peak_gib']:.2f} GiB in {p['peak_program']}, "
            f"{'fits' if p['fits'] else 'does not fit'}"
        )
    return p


def _found(changes: dict[str, Any], p: dict) -> dict:
    """A search's answer: the changes as overrides, with the plan's figures."""
    return dict(
        overrides=[_override(k, v) for k, v in changes.items()],
        changes=changes,
        peak_gib=p["peak_gib"],
        peak_program=p["peak_program"],
        est_step_s=p["est_step_s"],
    )


def find_fit(
    cfg: mlc.ConfigDict,
    target: Target,
    plan: dict,
    *,
    max_tries: int = 12,
    log: Callable[[str], None] | None = None,
) -> dict | None:
    """{"overrides": [...], "changes": {...}, "peak_gib", "peak_program", "est_step_s"} or None.

    `plan` is make_plan(cfg, target) (the one that did not fit).
    """
    n = target.num_devices
    tried = 0
    base: dict[str, Any] = {}
    current = plan
    for _round in range(3):  # each round adds one more knob on top of the best so far
        binding = next(
            (k for k, p in current["programs"].items() if not p["fits"]), current["peak_program"]
        )
        best: tuple[float, dict, dict] | None = None
        now = _apply(cfg, base)
        cost = (lambda c, p=current: estimate(c, p, target)) if "step_shape" in current else None
        growth = current["programs"].get("generate", {}).get("decode_growth", "copy")
        for change in candidates(now, binding, n, cost, growth):
            trial = {**base, **change}
            c = _apply(cfg, trial)
            if not _valid(c, target):
                continue
            if tried >= max_tries:
                return None
            tried += 1
            p = _plan_try(c, target, trial, log)
            if p["fits"]:
                return dict(_found(trial, p), tries=tried)
            if best is None or p["peak_gib"] < best[0]:
                best = (p["peak_gib"], trial, p)
        if best is None or best[0] >= current["peak_gib"]:
            return None
        base, current = best[1], best[2]
    return None


def fewest_microbatches(
    cfg: mlc.ConfigDict,
    target: Target,
    plan: dict,
    *,
    max_tries: int = 4,
    log: Callable[[str], None] | None = None,
) -> dict | None:
    """When `plan` (make_plan(cfg, target)) fits: the fewest algo.num_microbatches
    that still fits, halving the config's count. Fewer, larger micro-batches fill
    an accelerator better (docs/benchmarks.md, prompt sharing on a GPU) and read
    the weights fewer times; the step's memory grows with the rows per
    micro-batch, so the halving stops at the first count that does not fit or
    does not validate.

    Returns find_fit's dict for the fewest count found, or None when the
    config's count is already the fewest that fits (or the plan does not fit).
    """
    if not plan["fits"]:
        return None
    micro = int(cfg.algo.num_microbatches)
    found, tried = None, 0
    while micro % 2 == 0 and tried < max_tries:
        micro //= 2
        change = {"algo.num_microbatches": micro}
        c = _apply(cfg, change)
        if not _valid(c, target):
            break
        tried += 1
        p = _plan_try(c, target, change, log)
        if not p["fits"]:
            break
        found = _found(change, p)
    if found:
        found["tries"] = tried  # plans compiled, the one that stopped the halving included
    return found
