"""Param partitioning and born-sharded model creation.

Rules live next to the params (`transformer.PARAM_AXES`, stored as each
Param's `out_sharding` metadata); this module turns them into NamedShardings
for a concrete mesh, dropping any axis the mesh lacks or that does not divide
the dim (e.g. a dim of 3 on tensor=2 stays replicated; SmolLM2's k_proj has
3 x 64 = 192 columns, which split).

    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    model = create_model(cfg, mesh=mesh)        # never materialized unsharded
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax.models.config import ModelConfig
from gdpo_jax.models.transformer import Transformer
from gdpo_jax.sharding import AxisEntry, sanitize_spec

__all__ = [
    "AxisEntry",
    "abstract_model",
    "create_model",
    "get_param_shardings",
    "get_param_specs",
    "sanitize_spec",
    "shard_model",
]


def _var_spec(var: nnx.Variable, mesh: Any) -> P:
    axes = var.get_metadata().get("out_sharding") or ()
    return sanitize_spec(axes, var.get_value().shape, mesh)


def get_param_shardings(model: nnx.Module, mesh: jax.sharding.Mesh) -> nnx.State:
    """nnx.State of NamedSharding, same structure as nnx.state(model)."""
    state = nnx.state(model)
    return jax.tree.map(
        lambda v: v.replace(NamedSharding(mesh, _var_spec(v, mesh))),
        state,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )


def get_param_specs(model: nnx.Module, mesh: Any) -> dict[str, P]:
    """{'layers/q_proj': P(...), ...} for logging and tests."""
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(model)):
        out["/".join(map(str, path))] = _var_spec(var, mesh)
    return out


def shard_model(model: nnx.Module, mesh: jax.sharding.Mesh) -> nnx.Module:
    """Move an existing model's params onto their shardings (in place; returns it)."""
    shardings = get_param_shardings(model, mesh)
    nnx.update(model, jax.device_put(nnx.state(model), shardings))
    return model


def abstract_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """Shape-only Transformer (no memory, no FLOPs)."""
    return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(seed)))


def create_model(
    cfg: ModelConfig, *, mesh: jax.sharding.Mesh | None = None, seed: int = 0
) -> Transformer:
    """Random-init Transformer; with a mesh each param is created in its shards.

    nnx.eval_shape gives the structure and the metadata, then one jitted init
    with out_shardings writes every param directly into its device shards.
    """

    def init() -> Transformer:
        return Transformer(cfg, rngs=nnx.Rngs(seed))

    if mesh is None:
        graphdef, state = nnx.split(nnx.eval_shape(init))
        return nnx.merge(graphdef, jax.jit(lambda: nnx.state(init()))())
    abstract = nnx.eval_shape(init)
    graphdef, _ = nnx.split(abstract)
    shardings = get_param_shardings(abstract, mesh)
    state = jax.jit(lambda: nnx.state(init()), out_shardings=shardings)()
    return nnx.merge(graphdef, state)
