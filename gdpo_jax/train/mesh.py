"""Device mesh helpers: one ("data", "fsdp", "tensor") mesh for the whole run.

The rollout (batch) axis is sharded over ("data", "fsdp"); parameters are
sharded over "fsdp" and "tensor" by the model's partition rules. Any axis may
have size 1. A shape entry of -1 takes every device left over, so
`(-1, 1, 1)` is pure data parallelism on whatever machine runs the config.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")
BATCH_AXES: tuple[str, str] = ("data", "fsdp")
AXIS_TYPES = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, int, int]:
    """Replaces a single -1 in `shape` by what is left of `num_devices`.

    Raises ValueError naming `mesh.shape` when the product does not match.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(AXES):
        raise ValueError(f"mesh.shape={shape} must have {len(AXES)} entries, one per axis {AXES}.")
    if sum(s == -1 for s in shape) > 1:
        raise ValueError(f"mesh.shape={shape}: at most one entry may be -1.")
    if any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh.shape={shape}: entries must be positive or -1.")
    known = int(np.prod([s for s in shape if s != -1]))
    if -1 in shape:
        if num_devices % known:
            raise ValueError(
                f"mesh.shape={shape}: {num_devices} devices are not divisible by {known}; "
                "change mesh.shape."
            )
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    if int(np.prod(shape)) != num_devices:
        raise ValueError(
            f"mesh.shape={shape} needs {int(np.prod(shape))} devices but {num_devices} are "
            "available; set mesh.shape so its product is the device count (or use -1)."
        )
    return shape  # type: ignore[return-value]


def make_mesh(
    shape: Sequence[int] = (-1, 1, 1),
    *,
    axis_types: str = "explicit",
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh over `devices` (default: all devices)."""
    devices = list(jax.devices() if devices is None else devices)
    if axis_types not in AXIS_TYPES:
        raise ValueError(f"mesh.axis_types={axis_types!r}; use one of {tuple(AXIS_TYPES)}.")
    resolved = resolve_mesh_shape(shape, len(devices))
    return jax.make_mesh(resolved, AXES, (AXIS_TYPES[axis_types],) * len(AXES), devices=devices)


def batch_axis_size(mesh: Mesh | None) -> int:
    """Number of shards of the batch axis (product of the "data" and "fsdp" sizes)."""
    if mesh is None:
        return 1
    return int(np.prod([mesh.shape[a] for a in BATCH_AXES if a in mesh.shape]))


def batch_spec(ndim: int) -> P:
    """PartitionSpec sharding the leading (batch) dimension over the batch axes."""
    return P(BATCH_AXES, *([None] * (ndim - 1)))


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
    return NamedSharding(mesh, batch_spec(ndim))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def is_explicit(mesh: Mesh | None) -> bool:
    return mesh is not None and all(t == AxisType.Explicit for t in mesh.axis_types)


def constrain(x: jax.Array, mesh: Mesh | None, spec: P) -> jax.Array:
    """Pins the sharding of an intermediate inside jit, for either axis type.

    Explicit axes carry the sharding in the type (`reshard`); Auto axes take a
    hint (`with_sharding_constraint`). No-op without a mesh.
    """
    if mesh is None:
        return x
    if is_explicit(mesh):
        return jax.sharding.reshard(x, spec)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def check_batch_divisible(rows: int, mesh: Mesh | None, *, field: str) -> None:
    """Raises a ValueError naming `field` when `rows` cannot be split over the batch axes."""
    n = batch_axis_size(mesh)
    if rows % n:
        raise ValueError(
            f"{field}: {rows} rows cannot be split evenly over the mesh's batch axes "
            f"data x fsdp = {n}; choose {field} as a multiple of {n} or change mesh.shape."
        )
