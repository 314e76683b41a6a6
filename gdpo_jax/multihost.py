"""Host-side collectives over processes (`jax.distributed`); identity on one process.

A leaf module (jax and numpy only), used by the sampler (`sampling/hostio.py`),
the exporter (`models/export.py`) and the trainer (`train/distributed.py`).
Every process must call these, with equal shapes where noted.
"""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["allgather", "to_host"]


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
