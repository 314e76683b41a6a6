"""token_logprobs / token_entropy / chunked_token_logprobs vs NumPy (float64)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdpo_jax.core import chunked_token_logprobs, token_entropy, token_logprobs

B, T, D, V = 2, 7, 4, 11


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def np_pick(logp: np.ndarray, targets: np.ndarray) -> np.ndarray:
    out = np.zeros(targets.shape)
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            out[b, t] = logp[b, t, targets[b, t]]
    return out


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(B, T, V)) * 3).astype(np.float32)
    targets = rng.integers(0, V, (B, T)).astype(np.int32)
    hidden = rng.normal(size=(B, T, D)).astype(np.float32)
    unembed = rng.normal(size=(D, V)).astype(np.float32)
    return logits, targets, hidden, unembed


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_token_logprobs_and_entropy_vs_numpy(data, temperature):
    logits, targets, _, _ = data
    ref = np_log_softmax(logits / temperature)
    got = token_logprobs(logits, targets, temperature=temperature)
    assert got.dtype == jnp.float32 and got.shape == (B, T)
    np.testing.assert_allclose(got, np_pick(ref, targets), rtol=1e-5, atol=1e-5)
    ent = token_entropy(logits, temperature=temperature)
    np.testing.assert_allclose(ent, -(np.exp(ref) * ref).sum(-1), rtol=1e-5, atol=1e-5)


def test_entropy_of_peaked_distributions_with_large_logits():
    # lse - sum p x subtracts two numbers of the logits' size: with logits near 200-1000
    # it lost 1.4e-3 to 5.5e-2 of the entropy (f32); terms relative to the max keep it.
    rng = np.random.default_rng(1)
    for offset in (0.0, 40.0, 200.0, 1000.0):
        logits = (rng.normal(size=(3, 5, 64)) * 4 + offset).astype(np.float32)
        logits[..., 0] += 12.0  # peaked: one token holds most of the mass
        tol = max(5e-5, 2e-7 * offset)  # f32 spacing of the logits themselves
        for temperature in (1.0, 0.6):
            ref = np_log_softmax(logits.astype(np.float64) / temperature)
            want = -(np.exp(ref) * ref).sum(-1)
            got = np.asarray(token_entropy(logits, temperature=temperature))
            np.testing.assert_allclose(got, want, atol=tol, err_msg=f"offset {offset}")
            _, ent = chunked_token_logprobs(
                jnp.asarray(logits),
                jnp.eye(64, dtype=jnp.float32),
                jnp.zeros((3, 5), jnp.int32),
                temperature=temperature,
                chunk_size=2,
            )
            np.testing.assert_allclose(np.asarray(ent), want, atol=tol, err_msg=f"{offset}")


def test_stable_for_large_logits_and_bf16(data):
    logits, targets, _, _ = data
    big = logits * 1e4  # naive exp overflows float32
    got = np.asarray(token_logprobs(big, targets))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, np_pick(np_log_softmax(big), targets), rtol=1e-5, atol=1e-2)
    bf = jnp.asarray(logits, jnp.bfloat16)
    got_bf = token_logprobs(bf, targets)
    assert got_bf.dtype == jnp.float32  # computed in f32 from the bf16 values
    ref_bf = np_pick(np_log_softmax(np.asarray(bf.astype(jnp.float32))), targets)
    np.testing.assert_allclose(got_bf, ref_bf, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 16])
def test_chunked_equals_unchunked(data, chunk_size):
    _, targets, hidden, unembed = data
    logits = np.einsum("btd,dv->btv", hidden.astype(np.float64), unembed)
    ref = np_log_softmax(logits / 0.8)
    logp, ent = chunked_token_logprobs(
        hidden, unembed, targets, chunk_size=chunk_size, temperature=0.8
    )
    np.testing.assert_allclose(logp, np_pick(ref, targets), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, -(np.exp(ref) * ref).sum(-1), rtol=1e-5, atol=1e-5)


def test_chunked_gradients_match_unchunked(data):
    _, targets, hidden, unembed = data
    w = jnp.asarray(np.random.default_rng(1).normal(size=(B, T)), jnp.float32)

    def full(h, u):
        logits = jnp.einsum("btd,dv->btv", h, u)
        return jnp.sum(w * token_logprobs(logits, targets)) + jnp.sum(token_entropy(logits))

    def chunked(h, u):
        lp, ent = chunked_token_logprobs(h, u, targets, chunk_size=3)
        return jnp.sum(w * lp) + jnp.sum(ent)

    g_full = jax.jit(jax.grad(full, argnums=(0, 1)))(hidden, unembed)
    g_chunk = jax.jit(jax.grad(chunked, argnums=(0, 1)))(hidden, unembed)
    for a, b in zip(g_full, g_chunk):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_errors(data):
    logits, targets, hidden, unembed = data
    with pytest.raises(ValueError, match="targets must have shape"):
        token_logprobs(logits, targets[:, :3])
    with pytest.raises(ValueError, match="integer token ids"):
        token_logprobs(logits, targets.astype(np.float32))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, targets, temperature=0.0)
    with pytest.raises(ValueError, match="unembed"):
        chunked_token_logprobs(hidden, unembed.T, targets, chunk_size=2)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_token_logprobs(hidden, unembed, targets, chunk_size=0)


def _all_avals(jaxpr):
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            yield v.aval
        for p in eqn.params.values():
            for sub in p if isinstance(p, (list, tuple)) else [p]:
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    yield from _all_avals(getattr(inner, "jaxpr", inner))


def test_chunked_never_builds_full_logits():
    """Forward and backward hold at most one [B, chunk, V] block of logits."""
    b, t, d, v, c = 2, 64, 4, 11, 8
    hidden = jnp.ones((b, t, d))
    unembed = jnp.ones((d, v))
    targets = jnp.zeros((b, t), jnp.int32)

    def loss(h, u):
        lp, ent = chunked_token_logprobs(h, u, targets, chunk_size=c)
        return jnp.sum(lp) + jnp.sum(ent)

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(hidden, unembed).jaxpr
    sizes = [
        int(np.prod(a.shape))
        for a in _all_avals(jaxpr)
        if hasattr(a, "shape") and len(a.shape) and a.shape[-1] == v
    ]
    assert sizes and max(sizes) <= b * c * v, max(sizes)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_entropy_gradient_vs_numpy(data, temperature):
    """d H / d logits = -p (log p + H) / temperature, H = -sum p log p (float64 NumPy),
    through token_entropy and through chunked_token_logprobs (an entropy bonus
    differentiates it)."""
    logits, targets, hidden, unembed = data
    w = np.random.default_rng(2).normal(size=(B, T))

    def want(lg):
        logp = np_log_softmax(lg / temperature)
        p = np.exp(logp)
        ent = -(p * logp).sum(-1, keepdims=True)
        return -w[..., None] * p * (logp + ent) / temperature

    got = jax.grad(lambda lg: jnp.sum(w * token_entropy(lg, temperature=temperature)))(logits)
    np.testing.assert_allclose(got, want(logits), rtol=1e-4, atol=1e-6)

    # Through the chunked path: d/d hidden = (d/d logits) @ unembedᵀ.
    def chunked(h):
        ent = chunked_token_logprobs(h, unembed, targets, chunk_size=3, temperature=temperature)[1]
        return jnp.sum(w * ent)

    lg = np.einsum("btd,dv->btv", hidden.astype(np.float64), unembed)
    np.testing.assert_allclose(
        jax.grad(chunked)(hidden), want(lg) @ unembed.T.astype(np.float64), rtol=1e-4, atol=1e-5
    )


def _exp_widths(jaxpr) -> list[int]:
    """The last-axis width of every `exp` in a jaxpr, sub-jaxprs included."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "exp":
            out.append(eqn.outvars[0].aval.shape[-1])
        for p in eqn.params.values():
            for sub in p if isinstance(p, (list, tuple)) else [p]:
                inner = sub if hasattr(sub, "eqns") else getattr(sub, "jaxpr", None)
                if inner is not None:  # a Jaxpr (remat's) or a ClosedJaxpr (scan's)
                    out.extend(_exp_widths(getattr(inner, "jaxpr", inner)))
    return out


def test_logprobs_and_entropy_take_one_pass_of_exponentials(data):
    """The entropy reuses the log-sum-exp's exponentials: one [..., V] exp per chunk. With
    a second one (-sum exp(x - lse) (x - lse)), XLA:CPU fused that exp into a YNNPACK
    reduction several times slower than the log-sum-exp's own (docs/benchmarks.md)."""
    _, targets, hidden, unembed = data
    fwd = jax.make_jaxpr(
        lambda h: chunked_token_logprobs(h, unembed, targets, chunk_size=3, temperature=0.7)
    )(hidden).jaxpr
    assert _exp_widths(fwd) == [V]
    assert _exp_widths(jax.make_jaxpr(token_entropy)(data[0]).jaxpr) == [V]
