"""Device mesh helpers for the trainer (public entry point, kept for existing imports).

The definitions live in the leaf module `gdpo_jax.sharding`, shared with the
model, the sampler and the segment reductions; this module re-exports them.
"""

from __future__ import annotations

from gdpo_jax.sharding import (
    AXES,
    AXIS_TYPES,
    BATCH_AXES,
    batch_axes,
    batch_axis_size,
    batch_sharding,
    batch_spec,
    check_batch_divisible,
    constrain,
    is_explicit,
    make_mesh,
    replicated,
    resolve_mesh_shape,
)

__all__ = [
    "AXES",
    "AXIS_TYPES",
    "BATCH_AXES",
    "batch_axes",
    "batch_axis_size",
    "batch_sharding",
    "batch_spec",
    "check_batch_divisible",
    "constrain",
    "is_explicit",
    "make_mesh",
    "replicated",
    "resolve_mesh_shape",
]
