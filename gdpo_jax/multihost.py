"""Host-side collectives over processes (`jax.distributed`); identity on one process.

A leaf module (jax and numpy only), used by the sampler (`sampling/hostio.py`),
the exporter (`models/export.py`) and the trainer (`train/distributed.py`).
Every process must call these, with equal shapes where noted.
"""

from __future__ import annotations

import os

import jax
import numpy as np

__all__ = [
    "allgather",
    "cluster_env",
    "cluster_hint",
    "mpi_launch",
    "to_host",
    "undetected_launch_message",
]

# What JAX 0.10's cluster auto-detection (`jax._src.clusters`, each ClusterEnv's
# `is_env_present`) needs, mirrored here from the environment alone so that no private
# API runs: SLURM's job id alone is also set in an `salloc` shell or an sbatch script
# outside `srun`, where JAX finds no coordinator ("coordinator_address should be
# defined"); `OMPI_COMM_WORLD_SIZE` alone is also set by Open MPI 5 (no ORTE URI).
_SLURM = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
_OMPI = ("OMPI_MCA_orte_hnp_uri",)
# MPI launchers that start every process with its rank and the job's size, whether
# JAX detects them or not: Open MPI (4 with ORTE, which JAX detects; 5 with PRRTE, which
# it does not) and the PMI launchers of MPICH and Intel MPI (not detected).
_MPI_RANKS = (
    ("Open MPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    ("an MPICH / Intel MPI launcher", "PMI_SIZE", "PMI_RANK"),
)
# Every variable `cluster_env` and `mpi_launch` read (tests clear them to get a clean
# environment).
_ENV_HINTS = (
    "JAX_COORDINATOR_ADDRESS",
    "CLOUD_TPU_TASK_ID",
    "TPU_WORKER_HOSTNAMES",
    *_SLURM,
    *_OMPI,
    *(v for _, size, rank in _MPI_RANKS for v in (size, rank)),
)


def cluster_env() -> str | None:
    """The cluster environment JAX's `jax.distributed.initialize()` finds its
    coordinator in ("jax", "slurm", "ompi", "tpu"), or None.

    TPU_WORKER_HOSTNAMES counts only when it names more than one host: the
    planner (and libtpu's compile-only use on a CPU machine) sets it to
    "localhost", which must not start a multi-host initialization.
    """
    env = os.environ
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return "jax"
    if all(k in env for k in _SLURM):
        return "slurm"
    if all(k in env for k in _OMPI):
        return "ompi"
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if len(hosts) > 1 or "CLOUD_TPU_TASK_ID" in env:
        return "tpu"
    return None


def _env_process_count(kind: str | None) -> int | None:
    """The process count the cluster environment names (None: it names none)."""
    var = {"slurm": "SLURM_NTASKS", "ompi": "OMPI_COMM_WORLD_SIZE"}.get(kind or "")
    try:
        return int(os.environ[var]) if var else None
    except (KeyError, ValueError):
        return None


def mpi_launch() -> tuple[str, int, int, str, str] | None:
    """(launcher, size, rank, size variable, rank variable) of an MPI launch that
    started this process as one of several, or None.

    It is None for one process and under no launcher; it says nothing about whether
    JAX finds a coordinator there (`cluster_env`): Open MPI 5's `mpirun` and MPICH's
    `mpiexec` start several processes that JAX 0.10 does not detect.
    """
    env = os.environ
    for name, size_var, rank_var in _MPI_RANKS:
        try:
            size, rank = int(env[size_var]), int(env[rank_var])
        except (KeyError, ValueError):
            continue
        if size > 1:
            return name, size, rank, size_var, rank_var
    return None


def undetected_launch_message(launch: tuple[str, int, int, str, str]) -> str:
    """The one-line fix for an `mpi_launch` JAX does not detect, where no coordinator
    address was given: each process would otherwise train alone, all into one workdir."""
    name, size, rank, size_var, rank_var = launch
    return (
        f"config.distributed.coordinator_address is needed: this is process {rank} of "
        f"{size} started by {name} ({size_var}, {rank_var}), a launch jax.distributed "
        "does not detect; set it to host:port of process 0 (the process count and index "
        "are read from those variables), or distributed.initialize=never to run each "
        "process alone."
    )


def cluster_hint() -> bool:
    """This is one process of several in a cluster environment JAX detects.

    A detected environment of one process (`srun -n 1`, `mpirun -n 1`) is one
    process: initializing it would gain nothing.
    """
    kind = cluster_env()
    return kind is not None and _env_process_count(kind) != 1


def allgather(x: np.ndarray) -> np.ndarray:
    """[...] (same shape and dtype on every process) -> [process_count, ...] on every
    process, of x's dtype, exact.

    The values travel as raw bytes: `process_allgather` goes through device_put,
    which turns int64 / float64 into int32 / float32 without jax_enable_x64
    (2**31 + 5 wrapped, a float64 sum of counts rounded) while one process kept them.
    """
    x = np.asarray(x)
    n = jax.process_count()
    if n == 1:
        return x[None]
    if x.size == 0:  # equal shapes: nothing to exchange
        return np.empty((n,) + x.shape, x.dtype)
    from jax.experimental import multihost_utils

    # (reshape copies a non-contiguous x; np.ascontiguousarray would make a 0-d x 1-d)
    raw = x.reshape(-1).view(np.uint8)  # [size * itemsize]
    out = np.ascontiguousarray(multihost_utils.process_allgather(raw, tiled=False))
    return out.view(x.dtype).reshape((n,) + x.shape)


def to_host(x: jax.Array) -> np.ndarray:
    """The full value of a (possibly multi-host) array on every host."""
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
