"""Mesh and sharding helpers: one ("data", "fsdp", "tensor") mesh for the whole run.

A leaf module (jax and numpy only), used by every layer that places arrays:
the model (`models/`), the segment reductions (`core/segment.py`), the
sampler (`sampling/decode.py`) and the trainer (`train/`, re-exported as
`gdpo_jax.train.mesh`).

The rollout (batch) axis is sharded over ("data", "fsdp"); parameters are
sharded over "fsdp" and "tensor" by the model's partition rules. Any axis may
have size 1. A shape entry of -1 takes every device left over, so
`(-1, 1, 1)` is pure data parallelism on whatever machine runs the config.

All axes of a mesh have one type: Explicit (the sharding is part of each
array's type; `reshard` moves it) or Auto (GSPMD propagation;
`with_sharding_constraint` hints it). A mesh mixing the two is rejected by
`is_explicit` with a clear error, since every helper here (and the model's
forward, the segment reductions and the sampler) picks one code path per mesh.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax.errors import ConfigError

__all__ = [
    "AXES",
    "AXIS_TYPES",
    "BATCH_AXES",
    "AxisEntry",
    "batch_axes",
    "batch_axis_size",
    "batch_sharding",
    "batch_spec",
    "check_batch_divisible",
    "constrain",
    "context_mesh",
    "is_explicit",
    "make_mesh",
    "replicated",
    "resolve_mesh_shape",
    "sanitize_spec",
]

AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")
BATCH_AXES: tuple[str, str] = ("data", "fsdp")
AXIS_TYPES: dict[str, AxisType] = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}

# One dim's wanted mesh axes in a PartitionSpec: an axis name, several, or None.
AxisEntry = str | tuple[str, ...] | None


# --------------------------------------------------------------------- mesh
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
    """A ("data", "fsdp", "tensor") mesh over `devices` (default: all devices).

    Every axis gets the one type named by `axis_types` ("explicit" or "auto").
    Devices of several TPU slices (more than one `slice_index`, multi-slice over
    DCN) are laid out by `mesh_utils.create_hybrid_device_mesh`: the slices split
    the outermost batch axis that divides by their count ("data", else "fsdp"),
    so only the batch's gradient reduction (data) or the weights' gathers (fsdp)
    cross the slower DCN, never "tensor".
    """
    devices = list(jax.devices() if devices is None else devices)
    if axis_types not in AXIS_TYPES:
        raise ValueError(f"mesh.axis_types={axis_types!r}; use one of {tuple(AXIS_TYPES)}.")
    resolved = resolve_mesh_shape(shape, len(devices))
    types = (AXIS_TYPES[axis_types],) * len(AXES)
    slices = len({getattr(d, "slice_index", None) for d in devices})
    if slices > 1:
        return Mesh(_multislice_devices(resolved, slices, devices), AXES, axis_types=types)
    return jax.make_mesh(resolved, AXES, types, devices=devices)


def _multislice_devices(
    shape: tuple[int, int, int], slices: int, devices: Sequence[jax.Device]
) -> np.ndarray:
    """The device array of a ("data", "fsdp", "tensor") mesh over `slices` slices:
    the slices along "data" when it divides by their count, else along "fsdp"."""
    from jax.experimental import mesh_utils

    data, fsdp, tensor = shape
    if data % slices == 0:
        ici, dcn = (data // slices, fsdp, tensor), (slices, 1, 1)
    elif fsdp % slices == 0:
        ici, dcn = (data, fsdp // slices, tensor), (1, slices, 1)
    else:
        raise ConfigError(
            f"config.mesh.shape={shape}: the devices span {slices} slices, and neither data={data} "
            f"nor fsdp={fsdp} divides over them; make one a multiple of {slices}, "
            f"e.g. --config.mesh.shape='({slices},-1,{tensor})'."
        )
    return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices)


def is_explicit(mesh: Any) -> bool:
    """True when `mesh`'s axes are Explicit, False for Auto axes, no mesh or an empty one.

    Manual axes (inside `shard_map`) are ignored. Raises ValueError on a mesh
    that mixes Explicit and Auto axes: the helpers pick one code path per mesh
    (reshard vs. sharding constraint, typed scatter vs. plain scatter), and a
    mixed mesh would silently take a different one in each.
    """
    if mesh is None or getattr(mesh, "empty", False):
        return False
    types = {t for t in mesh.axis_types if t != AxisType.Manual}
    if AxisType.Explicit in types and AxisType.Auto in types:
        axes = dict(zip(mesh.axis_names, (str(t).split(".")[-1] for t in mesh.axis_types)))
        raise ValueError(
            f"mesh axis types {axes} mix Explicit and Auto, which gdpo_jax does not support; "
            "give every axis one type (make_mesh(..., axis_types='explicit' or 'auto'), "
            "config key mesh.axis_types)."
        )
    return AxisType.Explicit in types


def context_mesh() -> Any:
    """The (abstract) mesh set by `jax.set_mesh` / `use_abstract_mesh`, or None if none."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else mesh


# -------------------------------------------------------------- batch axes
def batch_axes(mesh: Any) -> tuple[str, ...]:
    """Mesh axes the rollout batch is sharded over (those of BATCH_AXES the mesh has)."""
    if mesh is None:
        return ()
    return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def batch_axis_size(mesh: Any) -> int:
    """Number of shards of the batch axis (product of the "data" and "fsdp" sizes)."""
    if mesh is None:
        return 1
    return int(np.prod([mesh.shape[a] for a in batch_axes(mesh)]))


def batch_spec(ndim: int) -> P:
    """PartitionSpec sharding the leading (batch) dimension over the batch axes."""
    return P(BATCH_AXES, *([None] * (ndim - 1)))


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
    """NamedSharding of an [N, ...] array (`ndim` dims) with N over the batch axes."""
    return NamedSharding(mesh, batch_spec(ndim))


def replicated(mesh: Mesh) -> NamedSharding:
    """NamedSharding holding a full copy on every device of `mesh`."""
    return NamedSharding(mesh, P())


def check_batch_divisible(rows: int, mesh: Mesh | None, *, field: str) -> None:
    """Raises a ValueError naming `field` when `rows` cannot be split over the batch axes."""
    n = batch_axis_size(mesh)
    if rows % n:
        raise ValueError(
            f"{field}: {rows} rows cannot be split evenly over the mesh's batch axes "
            f"data x fsdp = {n}; choose {field} as a multiple of {n} or change mesh.shape."
        )


# ------------------------------------------------------------------ specs
def sanitize_spec(axes: Sequence[AxisEntry], shape: Sequence[int], mesh: Any) -> P:
    """PartitionSpec for `shape` from wanted mesh axes per dim, made legal for `mesh`.

    Per dim: keep only axes the mesh has and that no earlier dim used; then drop
    trailing axes until the product of their sizes divides the dim.
    """
    names, sizes = tuple(mesh.axis_names), dict(mesh.shape)
    used: set[str] = set()
    out: list[AxisEntry] = []
    for dim, entry in zip(shape, tuple(axes) + (None,) * (len(shape) - len(axes))):
        wanted = (entry,) if isinstance(entry, str) else tuple(entry or ())
        keep = [a for a in wanted if a in names and a not in used]
        while keep and dim % math.prod(sizes[a] for a in keep):
            keep.pop()
        used.update(keep)
        out.append(None if not keep else keep[0] if len(keep) == 1 else tuple(keep))
    return P(*out)


def constrain(x: jax.Array, mesh: Any, spec: P) -> jax.Array:
    """Pins the sharding of an intermediate inside jit, for either axis type.

    Explicit axes carry the sharding in the type (`reshard`); Auto axes take a
    hint (`with_sharding_constraint`). `mesh` may be concrete or abstract (e.g.
    `context_mesh()`); no-op when it is None or every axis is Manual (inside a
    `shard_map` over the whole mesh, where each device holds its own block).
    """
    if mesh is None or all(t == AxisType.Manual for t in mesh.axis_types):
        return x
    if is_explicit(mesh):
        return jax.sharding.reshard(x, spec)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
