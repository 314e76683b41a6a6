"""core.dense: the projection whose CPU weight gradient is laid out for YNNPACK.

Its forward must be the plain einsum, and its gradients autodiff's (NumPy
references), on CPU, in bf16 and on an Explicit mesh with sharded contracted
dims; off CPU it must be the plain einsum (no custom VJP, no barrier).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax.backend import target_backend
from gdpo_jax.core.dense import dense
from gdpo_jax.sharding import make_mesh


def _data(shape_x=(3, 5, 8), f=6, seed=0):
    rs = np.random.RandomState(seed)
    x = rs.randn(*shape_x).astype(np.float32)
    w = rs.randn(shape_x[-1], f).astype(np.float32)
    g = rs.randn(*shape_x[:-1], f).astype(np.float32)  # the upstream gradient
    return x, w, g


def _grads(fn, x, w, g):
    """Gradients of <fn(x, w), g> (so the upstream gradient is g)."""
    return jax.grad(lambda x, w: jnp.sum(fn(x, w) * g), argnums=(0, 1))(x, w)


def test_forward_and_gradients_match_numpy():
    x, w, g = _data()
    y = jax.jit(dense)(x, w)
    np.testing.assert_allclose(np.asarray(y), x @ w, rtol=1e-5, atol=1e-5)
    dx, dw = jax.jit(lambda x, w: _grads(dense, x, w, g))(x, w)
    # NumPy: dX = g wᵀ, dW = Σ over rows of xᵀ g.
    np.testing.assert_allclose(np.asarray(dx), g @ w.T, rtol=1e-5, atol=1e-5)
    want_dw = x.reshape(-1, x.shape[-1]).T @ g.reshape(-1, g.shape[-1])
    np.testing.assert_allclose(np.asarray(dw), want_dw, rtol=1e-5, atol=1e-5)


def test_cpu_gradient_is_the_custom_one_and_equals_autodiff():
    x, w, g = _data(shape_x=(4, 8), f=5, seed=1)
    jaxpr = str(jax.make_jaxpr(lambda x, w: _grads(dense, x, w, g))(x, w))
    assert "optimization_barrier" in jaxpr  # the materialized xᵀ of the weight gradient
    plain = lambda x, w: jnp.einsum("...d,df->...f", x, w)  # noqa: E731
    for got, want in zip(_grads(dense, x, w, g), _grads(plain, x, w, g), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_off_cpu_it_is_the_plain_einsum():
    x, w, g = _data()
    with target_backend("cuda"):
        jaxpr = str(jax.make_jaxpr(lambda x, w: _grads(dense, x, w, g))(x, w))
    assert "custom_vjp" not in jaxpr and "optimization_barrier" not in jaxpr


def test_bf16_operands_with_f32_product_keep_autodiffs_dtypes():
    x, w, g = _data(seed=2)
    xb, wb = jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)

    def fn(x, w):
        return dense(x, w, preferred_element_type=jnp.float32)

    def plain(x, w):
        return jnp.einsum("...d,df->...f", x, w, preferred_element_type=jnp.float32)

    assert fn(xb, wb).dtype == jnp.float32
    got, want = _grads(fn, xb, wb, g), _grads(plain, xb, wb, g)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype == jnp.bfloat16
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-2, atol=2e-2
        )


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")
def test_explicit_mesh_with_sharded_contracted_dims():
    # Rows over ("data", "fsdp") and F over "tensor": both gradients contract a
    # sharded dim (dX over F, dW over the rows), which an Explicit mesh accepts
    # only with a named output sharding.
    mesh = make_mesh((2, 2, 2), axis_types="explicit")
    x, w, g = _data(shape_x=(8, 6), f=4, seed=3)
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"), None)))
        ws = jax.device_put(w, NamedSharding(mesh, P(None, "tensor")))
        gs = jax.device_put(g, NamedSharding(mesh, P(("data", "fsdp"), "tensor")))
        dx, dw = jax.jit(lambda x, w, g: _grads(dense, x, w, g))(xs, ws, gs)
    np.testing.assert_allclose(np.asarray(dx), g @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dw), x.T @ g, rtol=1e-5, atol=1e-5)
    assert dx.sharding.spec == xs.sharding.spec and dw.sharding.spec == ws.sharding.spec
