"""Host-side collectives over processes (`jax.distributed`); identity on one process.

A leaf module (jax and numpy only), used by the sampler (`sampling/hostio.py`),
the exporter (`models/export.py`) and the trainer (`train/distributed.py`).
Every process must call these, with equal shapes where noted.
"""

from __future__ import annotations

import os

import jax
import numpy as np

__all__ = ["allgather", "cluster_hint", "to_host"]

_ENV_HINTS = (
    "JAX_COORDINATOR_ADDRESS",
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_SIZE",
    "CLOUD_TPU_TASK_ID",
)


def cluster_hint() -> bool:
    """A cluster environment variable says this is one process of several.

    TPU_WORKER_HOSTNAMES counts only when it names more than one host: the
    planner (and libtpu's compile-only use on a CPU machine) sets it to
    "localhost", which must not start a multi-host initialization.
    """
    hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    return len(hosts) > 1 or any(k in os.environ for k in _ENV_HINTS)


def allgather(x: np.ndarray) -> np.ndarray:
    """[...] (same shape on every process) -> [process_count, ...] on every process."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=False))


def to_host(x: jax.Array) -> np.ndarray:
    """The full value of a (possibly multi-host) array on every host."""
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
