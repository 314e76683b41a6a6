"""Abstract inputs of the programs a run executes and their lowerings, for the planner.

Everything here is shapes and shardings only (ShapeDtypeStructs on the target's
abstract mesh; params never materialized): the train state with its optimizer
moments placed as `jit(tx.init)` would place them, the rollout batch the step
reads, and the sampler's prefill + decode program lowered for `rows` rows per
call. `plan.make_plan` compiles these and accounts for the memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax.models.config import ModelConfig
from gdpo_jax.train import mesh as mesh_lib


def _sds(shape: tuple[int, ...], dtype: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def _abstract_state(cfg, mc: ModelConfig, mesh):
    """(graphdef, TrainState of ShapeDtypeStructs, its shardings, model-state SDS, tx,
    schedule, StepConfig, abstract model)."""
    from gdpo_jax.models.sharding import abstract_model, get_param_shardings
    from gdpo_jax.train import state as state_lib
    from gdpo_jax.train.state import TrainState
    from gdpo_jax.train.step import StepConfig

    model = abstract_model(mc)
    shard = get_param_shardings(model, mesh)
    full = jax.tree.map(
        lambda v, s: _sds(v.shape, v.dtype, s),
        nnx.state(model),
        shard,
    )
    graphdef, _ = nnx.split(model, nnx.Param)  # the model holds only nnx.Param (as the run)
    params = full
    sc = StepConfig.from_config(cfg, batch_shards=mesh_lib.batch_axis_size(mesh))
    tx, schedule = state_lib.rl_optimizer(cfg, sc.updates_per_step)
    with jax.set_mesh(mesh):
        opt = jax.eval_shape(tx.init, params)
    rep = NamedSharding(mesh, P())
    # Explicit axes carry each moment's sharding in its type; Auto ones do not:
    # moments shaped like a param are placed like it (what jit(tx.init) does).
    by_shape = {(x.shape, str(x.dtype)): x.sharding for x in jax.tree.leaves(params)}
    opt = jax.tree.map(
        lambda x: _sds(
            x.shape,
            x.dtype,
            x.sharding
            if isinstance(x.sharding, NamedSharding) and x.sharding.mesh.shape == mesh.shape
            else by_shape.get((x.shape, str(x.dtype)), rep),
        ),
        opt,
    )
    state = TrainState(step=_sds((), jnp.int32, rep), params=params, opt_state=opt)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    return graphdef, state, shardings, full, tx, schedule, sc, model


def _batch(cfg, mesh, *, needs_ref: bool) -> dict[str, jax.ShapeDtypeStruct]:
    a, s = cfg.algo, cfg.sampling
    n, p, c, k = (
        a.num_prompts * a.group_size,
        s.max_prompt_len,
        s.max_new_tokens,
        len(cfg.rewards.names),
    )
    spec = {
        "prompt_ids": ((n, p), jnp.int32),
        "prompt_mask": ((n, p), jnp.int32),
        "completion_ids": ((n, c), jnp.int32),
        "completion_mask": ((n, c), jnp.int32),
        "old_logp": ((n, c), jnp.float32),
        "rewards": ((n, k), jnp.float32),
        "group_ids": ((n,), jnp.int32),
        "valid": ((n,), jnp.bool_),
    }
    if needs_ref:
        spec["ref_logp"] = ((n, c), jnp.float32)
    return {
        name: _sds(shape, dt, mesh_lib.batch_sharding(mesh, len(shape)))
        for name, (shape, dt) in spec.items()
    }


@dataclasses.dataclass(frozen=True)
class AbstractStep:
    """The fused step a run compiles, with its abstract state and rollout batch."""

    step: Any  # gdpo_jax.train.step.CompiledStep
    state: Any  # TrainState of ShapeDtypeStructs
    batch: dict[str, jax.ShapeDtypeStruct]
    full_state: Any  # the model's state, every param (the sampler's weights)
    model: Any  # the abstract model
    sc: Any  # StepConfig


def abstract_step(cfg, mc: ModelConfig, mesh) -> AbstractStep:
    """The step of `cfg` on `mesh`, built as a run builds it, with nothing materialized:
    `.step.lower(...)` and `.step.lower_logprobs(...)` give its programs."""
    from gdpo_jax.train.step import CompiledStep

    graphdef, state, shardings, full, tx, schedule, sc, model = _abstract_state(cfg, mc, mesh)
    batch = _batch(cfg, mesh, needs_ref=sc.needs_ref and not sc.ref_logp_in_step)
    step = CompiledStep(
        graphdef=graphdef, tx=tx, schedule=schedule, cfg=sc, state_shardings=shardings, mesh=mesh
    )
    return AbstractStep(step, state, batch, full, model, sc)


def decode_layers(cfg, mesh) -> str:
    """The decode form a run's Sampler uses: `sampling.decode_layers`, or on
    "auto" the default for the target's backend (the plan runs in target_backend)."""
    from gdpo_jax.sampling import decode

    layers = cfg.sampling.get("decode_layers", "auto")
    if layers == "auto":
        return decode.decode_layers_default(cfg.model.dtype, mesh.devices.size == 1)
    return layers


def continuous_prompt_slots(cfg) -> int:
    """Shared prompt slots per batch shard of the run's continuous batching (as
    the Sampler decides: ``sampling.continuous_prompt_slots`` with
    share_prompt_cache and G > 1), else 0 (a prompt copy per lane)."""
    from gdpo_jax.sampling.prompt_slots import prompt_slots_used

    s = cfg.sampling
    w = int(s.get("continuous_prompt_slots", 0))
    return prompt_slots_used(w, s.get("share_prompt_cache", True), cfg.algo.group_size)


def generate_program(cfg, graphdef_full, model_state, mesh, rows: int):
    """(fn, args, rows per call padded to the batch shards, its DecodeSpec (``group``:
    rows sharing a prompt's cache; ``layers``: `decode_layers`, as the run's
    Sampler), the mesh to call it under: None for continuous batching on one
    device) of the sampler's program: the static decode, or continuous batching's
    (``sampling.continuous_slots`` > 0: lanes per batch shard, every prompt copied
    into its lane or read from ``sampling.continuous_prompt_slots`` shared prompt
    slots, and on several devices the weights gathered once per call).

    args: the call's inputs as ShapeDtypeStructs (after `model_state`, which is
    passed through): prompt_ids / prompt_mask i32[U, P], row_prompt i32[B],
    active bool[B], key, temperature f32[], top_p f32[], eos_ids i32[1],
    stop_ids i32[0], stop_seqs i32[0, 1], row_limit i32[B], row_ids i32[B]
    (``decode.make_generate_fn``).
    """
    from gdpo_jax.sampling import decode
    from gdpo_jax.sampling.continuous import make_continuous_generate_fn

    s, g = cfg.sampling, cfg.algo.group_size
    m = int(s.max_new_tokens)
    spec = decode.DecodeSpec(
        max_new_tokens=m,
        # The run's Sampler's phases (sampling.decode_phases; 0 = its default).
        chunks=decode.decode_chunks(m, int(s.get("decode_phases", 0)) or None),
        top_k=int(s.top_k),
        use_top_p=s.top_p < 1.0,
        greedy=False,
        pad_id=0,
        layers=decode_layers(cfg, mesh),
    )
    growth = s.get("decode_growth", "auto")  # as the run's Sampler resolves it
    if growth == "auto":
        growth = decode.decode_growth_default(spec.layers)
    spec = dataclasses.replace(spec, growth=growth)
    rep, rows_sh = NamedSharding(mesh, P()), mesh_lib.batch_sharding(mesh, 1)
    shards = mesh_lib.batch_axis_size(mesh)
    b = -(-rows // shards) * shards
    slots = int(s.get("continuous_slots", 0))
    share = s.get("share_prompt_cache", True) and not slots  # as the Sampler decides
    spec = dataclasses.replace(spec, group=decode.shared_prompt_group(share, b, rows // g, g))
    call_mesh = mesh
    if slots and mesh.devices.size == 1:
        # As the Sampler: continuous batching on one device is the plain, unmeshed
        # call, every input (the weights too) a single-device array.
        call_mesh = None
        rep = rows_sh = jax.sharding.SingleDeviceSharding(mesh.devices.flat[0])
        if model_state is not None:
            model_state = jax.tree.map(lambda x: _sds(x.shape, x.dtype, rep), model_state)
    if slots:
        fn = make_continuous_generate_fn(
            graphdef_full,
            spec,
            slots,
            mesh=call_mesh,
            rows_per_prompt=g,
            prompt_slots=continuous_prompt_slots(cfg),
        )
    else:
        fn = decode.make_generate_fn(graphdef_full, spec, mesh)
    key = jax.eval_shape(lambda: jax.random.key(0))
    args = (
        model_state,
        _sds((rows // g, s.max_prompt_len), jnp.int32, rep),
        _sds((rows // g, s.max_prompt_len), jnp.int32, rep),
        _sds((b,), jnp.int32, rows_sh),
        _sds((b,), jnp.bool_, rows_sh),
        _sds((), key.dtype, rep),
        _sds((), jnp.float32, rep),
        _sds((), jnp.float32, rep),
        _sds((1,), jnp.int32, rep),
        _sds((0,), jnp.int32, rep),
        _sds((0, 1), jnp.int32, rep),
        _sds((b,), jnp.int32, rows_sh),  # row_limit: per-row token budgets
        _sds((b,), jnp.int32, rows_sh),  # row_ids: each row's id (random stream)
    )

    return fn, args, b, spec, call_mesh


def _generate_lowering(cfg, graphdef_full, model_state, mesh, rows: int):
    """(lower, rows per call padded, its DecodeSpec): `generate_program` lowered."""
    fn, args, b, spec, call_mesh = generate_program(cfg, graphdef_full, model_state, mesh, rows)

    def lower():
        with jax.set_mesh(call_mesh) if call_mesh is not None else contextlib.nullcontext():
            return fn.lower(*args)

    return lower, b, spec
