"""Sharding-aware segment reductions over rollout rows.

Group statistics are scatters over group ids (segment sums with a static number
of segments), never reshapes, so groups may be ragged and non-contiguous. The
helpers here make those scatters and the matching gathers work in every
sharding mode the project uses:

* no mesh / single device, and meshes with ``AxisType.Auto`` axes: plain
  scatter / gather, XLA's partitioner chooses the collectives;
* meshes with ``AxisType.Explicit`` axes (the ``jax.make_mesh`` default, under
  ``jax.set_mesh``): a scatter whose indices are sharded has no unambiguous
  output sharding, so the per-group result is declared replicated
  (``out_sharding=P()``, a cross-shard reduction) and the gather back to rows
  is declared sharded like the rows.

The per-group tables are tiny ([num_groups, C]) next to the rows, so
replicating them is the right layout anyway.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax.sharding import is_explicit

__all__ = [
    "explicit_rows",
    "match_rows",
    "replicate",
    "segment_max",
    "segment_min",
    "segment_sum",
    "take_rows",
]


def explicit_rows(x: jax.Array) -> NamedSharding | None:
    """The Explicit-mode sharding of ``x``'s leading (row) axis, else None.

    Args:
      x: array [N, ...] (a tracer inside jit).
    Returns:
      ``NamedSharding(mesh, P(row_axes))`` when ``x`` lives on a mesh with
      Explicit axes; None for no mesh, single device or Auto meshes (where
      plain scatters are already fine). A mesh mixing Explicit and Auto axes
      raises ValueError (see ``gdpo_jax.sharding.is_explicit``).
    """
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if not is_explicit(mesh):  # also None / empty; a mixed mesh is an error there
        return None
    spec = sharding.spec
    return NamedSharding(mesh, P(spec[0] if len(spec) else None))


def match_rows(x: jax.Array, rows: NamedSharding | None) -> jax.Array:
    """Reshards ``x`` [N, ...] so its rows are laid out like ``rows`` (no-op if None).

    Needed in Explicit mode, where elementwise ops between differently
    sharded operands are an error rather than an implicit collective.
    """
    if rows is None:
        return x
    spec = P(rows.spec[0], *([None] * (x.ndim - 1)))
    return jax.sharding.reshard(x, NamedSharding(rows.mesh, spec))


def replicate(x: jax.Array, rows: NamedSharding | None) -> jax.Array:
    """Gathers ``x`` onto every device in Explicit mode (for sorts over rows)."""
    if rows is None:
        return x
    return jax.sharding.reshard(x, NamedSharding(rows.mesh, P()))


def _scatter(
    op: str, x: jax.Array, ids: jax.Array, num_groups: int, init: float, rows: NamedSharding | None
) -> jax.Array:
    table = jnp.full((num_groups,) + x.shape[1:], init, x.dtype)
    # ids outside [0, num_groups) contribute nothing: negative ones too (a padding
    # id of -1 would otherwise wrap, NumPy-style, into the last group).
    kwargs = {"mode": "drop", "wrap_negative_indices": False}
    if rows is not None:
        kwargs["out_sharding"] = NamedSharding(rows.mesh, P())
    return getattr(table.at[ids], op)(x, **kwargs)


def segment_sum(
    x: jax.Array, ids: jax.Array, num_groups: int, rows: NamedSharding | None = None
) -> jax.Array:
    """Sum of ``x`` [N, ...] per group id [N] -> [num_groups, ...] (replicated)."""
    return _scatter("add", x, ids, num_groups, 0.0, rows)


def segment_max(
    x: jax.Array, ids: jax.Array, num_groups: int, rows: NamedSharding | None = None
) -> jax.Array:
    """Max of ``x`` [N, ...] per group -> [num_groups, ...]; -inf for empty groups."""
    return _scatter("max", x, ids, num_groups, -jnp.inf, rows)


def segment_min(
    x: jax.Array, ids: jax.Array, num_groups: int, rows: NamedSharding | None = None
) -> jax.Array:
    """Min of ``x`` [N, ...] per group -> [num_groups, ...]; +inf for empty groups."""
    return _scatter("min", x, ids, num_groups, jnp.inf, rows)


def take_rows(table: jax.Array, ids: jax.Array, rows: NamedSharding | None = None) -> jax.Array:
    """Gathers per-group values back to rows: ``table[ids]`` -> [N, ...].

    ``ids`` must already be clipped into range (callers mask invalid rows).
    """
    if rows is None:
        return table[ids]
    spec = P(rows.spec[0], *([None] * (table.ndim - 1)))
    return table.at[ids].get(out_sharding=NamedSharding(rows.mesh, spec))
