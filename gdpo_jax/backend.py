"""The platform kernels are chosen for (a leaf: imports only jax).

Programs are usually built for the backend that runs them, but the
ahead-of-time planner lowers GPU and TPU programs on a CPU host; inside
``target_backend(platform)`` every kernel choice (attention kernel, the CPU
weight-gradient layout of ``core.dense``) is made for ``platform``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax

__all__ = ["effective_backend", "target_backend"]

# The platform programs are being built for, when it is not the one running them.
_TARGET_BACKEND: list[str] = []


@contextlib.contextmanager
def target_backend(platform: str) -> Iterator[None]:
    """Within this block, kernels are chosen for `platform` ("gpu"/"cuda", "tpu", "cpu")
    instead of JAX's default backend: the planner lowers a GPU run's programs with
    the kernels a GPU run would use."""
    _TARGET_BACKEND.append("gpu" if platform in ("cuda", "rocm") else platform)
    try:
        yield
    finally:
        _TARGET_BACKEND.pop()


def effective_backend() -> str:
    """The backend kernels are chosen for: the innermost target_backend, else JAX's."""
    return _TARGET_BACKEND[-1] if _TARGET_BACKEND else jax.default_backend()
