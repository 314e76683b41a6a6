"""Dense projection ``x @ w`` whose weight gradient XLA:CPU computes fast.

Every weight matmul of the model (q/k/v/o, gate/up/down, the unembedding) goes
through :func:`dense`. Its forward is a plain einsum. Its backward differs from
autodiff's on CPU only: the weight gradient ``dW = xᵀ @ dY`` contracts the
rows of both operands, and XLA:CPU lowers that to a copy of ``x`` plus its
generic (non-YNNPACK) dot. Transposing ``x`` explicitly first (kept apart by an
optimization barrier, so XLA cannot fold the transpose back into the dot)
turns it into a plain ``[D, N] @ [N, F]`` product that YNNPACK runs fast
(``bench_rl``'s step, both lowerings timed alternately: ``python -m
benchmarks.profile_step``, its table in docs/benchmarks.md).
GPU and TPU read a transposed operand natively, so there (and when the planner
lowers for them, see gdpo_jax.backend) :func:`dense` is the plain einsum and
autodiff's gradient. Values are the same maths either way (f32 sums in another
order).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from gdpo_jax.backend import effective_backend
from gdpo_jax.sharding import is_explicit

__all__ = ["dense"]


def dense(x: jax.Array, w: jax.Array, preferred_element_type: Any = None) -> jax.Array:
    """f[..., D] @ f[D, F] -> [..., F] (``preferred_element_type``: the product's dtype,
    default the operands'). x and w must share a dtype (cast w first)."""
    if effective_backend() != "cpu":
        return _einsum(x, w, preferred_element_type)
    return _dense_cpu(x, w, preferred_element_type)


def _einsum(x: jax.Array, w: jax.Array, preferred: Any) -> jax.Array:
    return jnp.einsum("...d,df->...f", x, w, preferred_element_type=preferred)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dense_cpu(x: jax.Array, w: jax.Array, preferred: Any) -> jax.Array:
    return _einsum(x, w, preferred)


def _dense_cpu_fwd(x: jax.Array, w: jax.Array, preferred: Any):
    return _einsum(x, w, preferred), (x, w)


def _out_sharding(like: jax.Array) -> Any:
    """On an Explicit mesh a product over sharded dims needs its output sharding named:
    the primal's (as autodiff's own transpose rules do); else None (propagated)."""
    sharding = jax.typeof(like).sharding
    return sharding if is_explicit(getattr(sharding, "mesh", None)) else None


def _dense_cpu_bwd(preferred: Any, res: tuple[jax.Array, jax.Array], g: jax.Array):
    x, w = res
    acc = preferred or x.dtype
    # dX = dY @ wᵀ: autodiff's own form (measured no faster with wᵀ materialized).
    dx = jnp.einsum(
        "...f,df->...d", g, w, preferred_element_type=acc, out_sharding=_out_sharding(x)
    ).astype(x.dtype)
    # dW = xᵀ @ dY with xᵀ materialized as [D, ...] (contracted dims minor).
    xt = jax.lax.optimization_barrier(jnp.moveaxis(x, -1, 0))
    dw = jnp.einsum(
        "d...,...f->df", xt, g, preferred_element_type=acc, out_sharding=_out_sharding(w)
    ).astype(w.dtype)
    return dx, dw


_dense_cpu.defvjp(_dense_cpu_fwd, _dense_cpu_bwd)
