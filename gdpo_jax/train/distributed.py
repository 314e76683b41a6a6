"""Multi-host set-up and the host -> global-array path of the batch.

Every process samples and scores its own share of the prompts (per-host
data); the step sees one global batch assembled with
`jax.make_array_from_process_local_data`, so the advantage statistics (group
and batch) are over all hosts, as the reference implementations require.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from gdpo_jax import sharding as mesh_lib
from gdpo_jax import xla_cpu
from gdpo_jax.errors import ConfigError
from gdpo_jax.multihost import allgather as allgather_host
from gdpo_jax.multihost import cluster_env, cluster_hint, mpi_launch, undetected_launch_message
from gdpo_jax.multihost import to_host as to_host  # re-export (public name)


def initialize(
    mode: str = "auto",
    *,
    coordinator_address: str = "",
    num_processes: int = 0,
    process_id: int = -1,
) -> bool:
    """Calls `jax.distributed.initialize` when asked or when the environment asks for it.

    mode: "never" does nothing; "always" initializes (explicit arguments, else
      JAX's cluster auto-detection); "auto" initializes when an address or more than
      one process is given, or in a cluster environment JAX detects that names more
      than one process (`gdpo_jax.multihost.cluster_hint`: an `salloc` shell's
      SLURM_JOB_ID alone is not one). Under an MPI launch JAX does not detect
      (Open MPI 5, MPICH: `multihost.mpi_launch`), "auto" asks for the coordinator
      address and takes the process count and index from the launcher.
    Must run before anything touches a device. Returns True when initialized.
    """
    if mode == "never":
        return False
    explicit = bool(coordinator_address) or num_processes > 1
    launch = mpi_launch()
    if mode == "auto" and not explicit and not cluster_hint():
        if launch is not None and cluster_env() is None:
            raise ConfigError(undetected_launch_message(launch))
        return False
    if coordinator_address and launch is not None and cluster_env() is None:
        # An MPI launch JAX does not detect (Open MPI 5, MPICH): it names the process
        # count and index, which JAX would otherwise ask for.
        num_processes = num_processes or launch[1]
        process_id = launch[2] if process_id < 0 else process_id
    kwargs: dict[str, Any] = {}
    if coordinator_address:
        kwargs["coordinator_address"] = coordinator_address
    if num_processes:
        kwargs["num_processes"] = num_processes
    if process_id >= 0:
        kwargs["process_id"] = process_id
    # JAX's preemption service would take SIGTERM in every process for its own sync
    # point, which the runs do not use (`train/preemption.py`): a run that checkpoints
    # nothing went on to its end instead of stopping.
    jax.config.update("jax_enable_preemption_service", False)
    if (jax.config.jax_platforms or "").strip() == "cpu":
        # Several processes' CPU devices share every collective (gloo): XLA:CPU's default
        # scheduler can order them differently per process and deadlock (xla_cpu.py).
        xla_cpu.use_ordered_scheduler(several_processes=True)
    try:
        jax.distributed.initialize(**kwargs)
    except ValueError as e:
        # JAX found no cluster to take the missing arguments from: say what to set.
        missing = ("coordinator_address should", "Number of processes", "The process id")
        if not str(e).startswith(missing):
            raise
        raise ConfigError(
            f"jax.distributed.initialize: {e} No cluster environment JAX detects "
            "(srun, mpirun, a TPU pod) gave it: set config.distributed.coordinator_address "
            "(host:port of process 0), num_processes and process_id, or "
            "distributed.initialize=never for one process."
        ) from None
    return True


def initialize_from_config(cfg: ml_collections.ConfigDict) -> bool:
    """`initialize` with the arguments of `cfg.distributed`."""
    d = cfg.distributed
    return initialize(
        d.initialize,
        coordinator_address=d.coordinator_address,
        num_processes=d.num_processes,
        process_id=d.process_id,
    )


def host_rows(global_rows: int) -> tuple[int, int]:
    """(start, stop) of this process's rows of a global batch split evenly over processes."""
    n, i = jax.process_count(), jax.process_index()
    if global_rows % n:
        raise ValueError(f"{global_rows} batch rows do not split over {n} processes.")
    per = global_rows // n
    return i * per, (i + 1) * per


def to_global(local: Mapping[str, np.ndarray], mesh: Mesh | None) -> dict[str, jax.Array]:
    """Host-local batch rows -> global arrays sharded over the mesh's batch axes.

    Each process passes its own rows (leading dimension), the same number on
    every process; the global leading dimension is that number x the process
    count. Without a mesh, a plain device_put.
    """
    if mesh is None:
        return {k: jax.device_put(np.asarray(v)) for k, v in local.items()}
    out = {}
    for k, v in local.items():
        v = np.asarray(v)
        sharding = mesh_lib.batch_sharding(mesh, v.ndim)
        global_shape = (v.shape[0] * jax.process_count(),) + v.shape[1:]
        out[k] = jax.make_array_from_process_local_data(sharding, v, global_shape)
    return out


# --------------------------------------------------------------------------- #
# Small host-side collectives (identity on one process). Every process must
# call them, with equal shapes where noted. `allgather_host` and `to_host`
# are gdpo_jax.multihost's, re-exported under their historical names.
# --------------------------------------------------------------------------- #
def any_process(flag: bool) -> bool:
    """True on every process when `flag` is True on any."""
    return bool(allgather_host(np.asarray([bool(flag)])).any())


def sum_processes(x: float) -> float:
    """Sum of a host scalar over processes."""
    return float(allgather_host(np.asarray([float(x)], np.float64)).sum())


def reduce_processes(
    values: Mapping[str, float], *, max_prefixes: tuple[str, ...] = ()
) -> dict[str, float]:
    """Host scalars combined over processes: max for keys starting with one of
    `max_prefixes` (times: the slowest host sets the pace), sum for the rest
    (counts). Every process must pass the same keys."""
    keys = sorted(values)
    table = allgather_host(np.asarray([float(values[k]) for k in keys], np.float64))
    return combine_rows(table, keys, max_prefixes=max_prefixes)


def combine_rows(
    table: np.ndarray, keys: Sequence[str], *, max_prefixes: tuple[str, ...] = ()
) -> dict[str, float]:
    """f64[P, K] per-process values of `keys` -> {key: max or sum over P} (see above)."""
    table = np.asarray(table, np.float64).reshape(-1, len(keys))
    return {
        k: float(table[:, j].max() if k.startswith(max_prefixes) else table[:, j].sum())
        for j, k in enumerate(keys)
    }


def allgather_strings(texts: list[str]) -> list[list[str]]:
    """Every process's list of strings (any lengths), indexed by process."""
    if jax.process_count() == 1:
        return [list(texts)]
    # surrogatepass both ways: a decoded completion can hold a lone surrogate, which a
    # strict encode raised on one process while the others waited in the collective
    # below (a hang); one process passes such text through, and so do N.
    raw = [t.encode("utf-8", "surrogatepass") for t in texts]
    sizes = allgather_host(np.asarray([len(raw), max((len(b) for b in raw), default=0)]))
    n, width = int(sizes[:, 0].max()), max(int(sizes[:, 1].max()), 1)
    buf = np.zeros((n, width), np.uint8)
    lens = np.zeros((n,), np.int64)
    for i, b in enumerate(raw):
        buf[i, : len(b)] = np.frombuffer(b, np.uint8)
        lens[i] = len(b)
    bufs, all_lens = allgather_host(buf), allgather_host(lens)
    return [
        [
            bytes(bufs[p, i, : all_lens[p, i]]).decode("utf-8", "surrogatepass")
            for i in range(int(sizes[p, 0]))
        ]
        for p in range(bufs.shape[0])
    ]
