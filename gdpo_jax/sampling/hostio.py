"""Host <-> global-array I/O of the sampler, for one or several processes.

With several processes (``jax.distributed``), every process passes its *own*
prompts to ``Sampler.generate`` and gets its own rows back. The global batch
is the concatenation of the processes' row blocks in process order (the
order of their row blocks on the mesh's ("data", "fsdp") batch axes):

    process p's rows -> global rows [p * rows_per_process, (p + 1) * rows_per_process)

so a run's rollouts do not depend on how many processes feed it (the
sampler's randomness is a function of each row's id, `filters.row_keys`:
fold_in(fold_in(key, id), t), where the id counts the real rows before it).
Prompts are small: every process learns every prompt (one host all-gather
of the token ids), since each distinct prompt is prefilled once and shared
by its G rows on whichever device they live.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax.multihost import allgather

# allgather is re-exported here for existing callers (hostio.allgather).
__all__ = [
    "allgather",
    "local_rows",
    "replicate_key",
    "row_block",
    "scalar",
    "to_global_rows",
    "to_global_replicated",
]


def row_block(mesh: jax.sharding.Mesh | None, axes: Sequence[str]) -> tuple[int, int]:
    """(index, count) of this process's row block among the processes.

    The batch axis is split into ``prod(mesh.shape[a] for a in axes)`` shards;
    each process must hold a contiguous run of them, disjoint from the other
    processes' (true for jax.make_mesh meshes whose batch axes span the
    processes). Single process: (0, 1).
    """
    if mesh is None or jax.process_count() == 1:
        return 0, 1
    shards = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
    sharding = NamedSharding(mesh, P(tuple(axes) if axes else None))
    owners: dict[int, set[int]] = {}
    for dev, idx in sharding.devices_indices_map((shards,)).items():
        start = idx[0].start or 0
        owners.setdefault(dev.process_index, set()).add(start)
    mine = sorted(owners[jax.process_index()])
    ranges = sorted((min(s), max(s)) for s in owners.values())
    per = len(mine)
    disjoint = all(len(s) == per and max(s) - min(s) + 1 == per for s in owners.values())
    disjoint = disjoint and all(ranges[i][1] < ranges[i + 1][0] for i in range(len(ranges) - 1))
    if not disjoint or len(owners) * per != shards:
        raise ValueError(
            "Sampler with several processes needs each process to own a distinct, contiguous "
            f"block of the batch axes {tuple(axes)} (mesh shape {dict(mesh.shape)}); put the "
            "processes along 'data'/'fsdp' (e.g. mesh.shape=(-1, 1, 1))."
        )
    return [r[0] for r in ranges].index(mine[0]), len(owners)


def to_global_rows(
    x: np.ndarray, mesh: jax.sharding.Mesh | None, axes: Sequence[str], nblocks: int
) -> jax.Array | np.ndarray:
    """This process's rows [n_local, ...] -> global array [nblocks * n_local, ...]
    sharded over `axes` on its leading dimension. No mesh: unchanged."""
    if mesh is None:
        return x
    spec = P(tuple(axes) if axes else None, *([None] * (x.ndim - 1)))
    shape = (x.shape[0] * nblocks,) + x.shape[1:]
    return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), x, shape)


def to_global_replicated(x: np.ndarray, mesh: jax.sharding.Mesh | None) -> jax.Array | np.ndarray:
    """The same host value on every process -> a replicated global array."""
    if mesh is None:
        return x
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, P()), lambda idx: x[idx])


def replicate_key(key: jax.Array, mesh: jax.sharding.Mesh | None) -> jax.Array:
    """A PRNG key (same value on every process) replicated over the mesh."""
    if mesh is None or jax.process_count() == 1:
        return key
    data = to_global_replicated(np.asarray(jax.random.key_data(key)), mesh)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(key))


def local_rows(x: jax.Array, lo: int, hi: int) -> np.ndarray:
    """Global rows [lo, hi) of `x` read from this process's shards (no communication)."""
    if x.is_fully_addressable:
        return np.asarray(x)[lo:hi]
    out = np.empty((hi - lo,) + x.shape[1:], x.dtype)
    filled = np.zeros(hi - lo, bool)
    for shard in x.addressable_shards:
        rows = shard.index[0]
        start, stop = rows.start or 0, x.shape[0] if rows.stop is None else rows.stop
        a, b = max(start, lo), min(stop, hi)
        if a >= b:
            continue
        if any(
            s != slice(None) and (s.start, s.stop) != (0, d)
            for s, d in zip(shard.index[1:], x.shape[1:])
        ):
            raise ValueError("local_rows: only the leading dimension may be sharded.")
        out[a - lo : b - lo] = np.asarray(shard.data)[a - start : b - start]
        filled[a - lo : b - lo] = True
    if not filled.all():
        raise ValueError(f"rows [{lo}, {hi}) are not all held by this process.")
    return out


def scalar(x: jax.Array) -> np.ndarray:
    """A replicated (possibly multi-process) scalar on the host."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)
