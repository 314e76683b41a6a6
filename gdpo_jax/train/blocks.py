"""The step's batch layout: rows [N, ...] <-> blocks [mini, micro, N / (mini micro), ...].

Mini-batch u takes units u, u + U, u + 2U, ... of the batch, and micro-batch m
of it that mini-batch's units m, m + M, ...; a unit is a whole prompt group (G
rows, prompt-major) where every batch shard's share of every mini- (micro-)
batch is whole groups, else one row (`StepConfig.layout_units`). So a
mini-batch is whole groups (as verl's) when the units are groups; given the
units, which rows it holds does not depend on the mesh (the choice of units
does: it depends on the batch-shard count), and every device keeps its own rows
(no communication).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gdpo_jax.sharding import BATCH_AXES, constrain, context_mesh, is_explicit, sanitize_spec

__all__ = ["from_blocks", "to_blocks"]


def _rows_reshape(x: jax.Array, shape: tuple[int, ...], rows_dim: int) -> jax.Array:
    """x.reshape(shape), the batch's rows (sharded over ("data", "fsdp")) in dim
    `rows_dim` of the result. Explicit axes need the result's sharding spelled
    out (JAX does not infer it for a split or merge of a sharded dim)."""
    mesh = context_mesh()
    if mesh is None:
        return x.reshape(shape)
    spec = sanitize_spec((None,) * rows_dim + (BATCH_AXES,), shape, mesh)
    if is_explicit(mesh):
        return jax.lax.reshape(x, shape, out_sharding=spec)
    return constrain(x.reshape(shape), mesh, spec)


def to_blocks(x: jax.Array, mini: int, micro: int, units: tuple[int, int] = (1, 1)) -> jax.Array:
    """[N, ...] -> [mini, micro, N / (mini micro), ...]: the step's batch layout.

    `units` = (a, b), rows per unit (1: single rows, G: whole prompt groups).
    Mini-batch u takes units u, u + mini, u + 2 mini, ... of a rows; micro-batch
    m of it takes its units m, m + micro, ... of b rows. Which rows land in
    which mini- and micro-batch depends on N, mini, micro and the units, never
    on the mesh; and when every batch shard holds a multiple of mini x micro
    units, each block keeps its rows on the shards that hold them.
    """
    a, b = units
    n, rest = x.shape[0], x.shape[1:]
    y = jnp.swapaxes(_rows_reshape(x, (n // (mini * a), mini, a, *rest), 0), 0, 1)
    y = _rows_reshape(y, (mini, n // mini, *rest), 1)
    y = jnp.swapaxes(_rows_reshape(y, (mini, n // (mini * micro * b), micro, b, *rest), 1), 1, 2)
    return _rows_reshape(y, (mini, micro, n // (mini * micro), *rest), 2)


def from_blocks(x: jax.Array, units: tuple[int, int] = (1, 1)) -> jax.Array:
    """Inverse of to_blocks: [mini, micro, N / (mini micro), ...] -> [N, ...]."""
    a, b = units
    mini, micro, per = x.shape[:3]
    rest = x.shape[3:]
    n = mini * micro * per
    y = jnp.swapaxes(_rows_reshape(x, (mini, micro, per // b, b, *rest), 2), 1, 2)
    y = _rows_reshape(y, (mini, n // mini, *rest), 1)
    y = jnp.swapaxes(_rows_reshape(y, (mini, n // (mini * a), a, *rest), 1), 0, 1)
    return _rows_reshape(y, (n, *rest), 0)
