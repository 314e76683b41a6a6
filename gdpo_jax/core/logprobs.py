"""Per-token log-probabilities and entropies of a tempered softmax, in f32.

The target logit is picked with a masked reduction over the vocabulary rather
than a gather, so the same code works when the vocabulary axis is sharded
(tensor parallelism) and XLA fuses it with the log-sum-exp pass.
``chunked_token_logprobs`` goes from final hidden states to log-probs without
ever holding [B, T, V] logits: it scans over sequence chunks and rematerializes
each chunk's logits in the backward pass.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from gdpo_jax.core.dense import dense

__all__ = ["chunked_token_logprobs", "token_entropy", "token_logprobs", "unembed_logits"]


def unembed_logits(hidden: jax.Array, unembed: jax.Array) -> jax.Array:
    """Logits of final hidden states: f[..., D] x f[D, V] -> f32[..., V].

    The one definition of the output projection, used by the model's own
    logits, the sampler and the trainer's log-probs: the unembedding is cast
    to the hidden states' (compute) dtype and products accumulate in f32. With
    f32 params and bf16 compute, upcasting both operands in one place but not
    the other gave sampler and trainer log-probs ~1e-2 apart, so the first
    update's ratio was not 1 under ``old_logprobs="sampler"``.
    """
    return dense(hidden, unembed.astype(hidden.dtype), preferred_element_type=jnp.float32)


def _check_temperature(temperature: float) -> None:
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}.")


def _check_targets(shape: tuple[int, ...], targets: jax.Array, what: str) -> None:
    if targets.shape != shape:
        raise ValueError(
            f"targets must have shape {shape} to match {what}; got {tuple(targets.shape)}."
        )
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        raise ValueError(f"targets must be integer token ids; got dtype {targets.dtype}.")


def _lse_and_entropy(x: jax.Array, want_entropy: bool) -> tuple[jax.Array, jax.Array | None]:
    """log-sum-exp of x f32[..., V] over V, and (want_entropy) the entropy -sum p log p
    of softmax(x): (f32[...], f32[...] | None). One pass of exponentials serves both.

    The log-sum-exp is `jax.nn.logsumexp`'s computation, operation for operation (the
    max held out of the gradient, a non-finite max replaced by 0): without the entropy
    the log-probs are bit-for-bit what it gives; with it, XLA fuses the tempered
    logits into other kernels, and log-probs at temperature 0.7 moved by up to 4e-6
    (a few f32 ulps of their size; bit-equal at temperature 1) when this replaced a
    second pass. The entropy reuses the exponentials e = exp(x - max):
    with s = sum e, p = e / s and log p = (x - max) - log s, so

        H = -sum p log p = log s - sum(e (x - max)) / s.

    Both terms are relative to the max: a peaked distribution gives two small numbers,
    not lse - sum p x, which subtracts two of the logits' size (it lost 1e-3 to 5e-2 of
    such an entropy with logits of a few hundred, f32). And the [..., V] exponentials
    are computed once: written as -sum exp(x - lse) (x - lse), XLA:CPU fused the second
    exp into a YNNPACK reduction several times slower than the log-sum-exp's own (at
    SmolLM2-135M's vocabulary, the step's reductions took about twice as long as
    without it; docs/benchmarks.md).
    """
    amax = jnp.max(x, axis=-1)
    amax = jax.lax.stop_gradient(jnp.where(jnp.isfinite(amax), amax, jnp.zeros_like(amax)))
    z = x - amax[..., None]
    e = jnp.exp(z)
    s = jnp.sum(e, axis=-1)
    lse = jnp.log(s) + amax
    if not want_entropy:
        return lse, None
    return lse, jnp.log(s) - jnp.sum(e * z, axis=-1) / s


def _logp_and_entropy(
    logits: jax.Array, targets: jax.Array, temperature: float, want_entropy: bool
) -> tuple[jax.Array, jax.Array | None]:
    """logits f[..., V], targets i[...] -> (logp f32[...], entropy f32[...] | None)."""
    x = logits.astype(jnp.float32) / temperature
    lse, entropy = _lse_and_entropy(x, want_entropy)
    vocab = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    picked = jnp.sum(jnp.where(vocab == targets[..., None], x, 0.0), axis=-1)
    return picked - lse, entropy


def token_logprobs(logits: jax.Array, targets: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """log softmax(logits / temperature)[targets].

    Args:
      logits: f[B, T, V] (any float dtype; upcast to f32).
      targets: i32[B, T] token ids (the next tokens).
      temperature: > 0; the sampler's temperature, so log-probs match its
        tempered distribution.
    Returns:
      f32[B, T].
    """
    logits, targets = jnp.asarray(logits), jnp.asarray(targets)
    _check_temperature(temperature)
    _check_targets(logits.shape[:-1], targets, "logits [B, T, V]")
    return _logp_and_entropy(logits, targets, temperature, want_entropy=False)[0]


def token_entropy(logits: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """Entropy of softmax(logits / temperature) per position: f[B, T, V] -> f32[B, T]."""
    logits = jnp.asarray(logits)
    _check_temperature(temperature)
    x = logits.astype(jnp.float32) / temperature
    return _lse_and_entropy(x, want_entropy=True)[1]


def chunked_token_logprobs(
    hidden: jax.Array,
    unembed: jax.Array,
    targets: jax.Array,
    *,
    chunk_size: int,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Log-probs and entropies from final hidden states, chunk by chunk.

    Peak memory is one [B, chunk_size, V] f32 logits block, forward and
    backward (the chunk body is rematerialized under ``jax.checkpoint``).

    Args:
      hidden: f[B, T, D] final-normed hidden states, in the compute dtype.
      unembed: f[D, V] output projection (``model.unembed_matrix()``); cast to
        hidden's dtype, see ``unembed_logits``.
      targets: i32[B, T].
      chunk_size: static positions per chunk (T is padded up to a multiple).
      temperature: > 0.
    Returns:
      (logp f32[B, T], entropy f32[B, T]).
    """
    hidden, unembed, targets = jnp.asarray(hidden), jnp.asarray(unembed), jnp.asarray(targets)
    _check_temperature(temperature)
    if hidden.ndim != 3 or unembed.ndim != 2 or hidden.shape[-1] != unembed.shape[0]:
        raise ValueError(
            f"need hidden [B, T, D] and unembed [D, V]; got "
            f"{tuple(hidden.shape)} and {tuple(unembed.shape)}."
        )
    _check_targets(hidden.shape[:2], targets, "hidden [B, T, D]")
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}.")
    b, t, d = hidden.shape
    c = min(int(chunk_size), t)
    n = math.ceil(t / c)
    pad = n * c - t
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    # [n, B, c, ...]: scan over chunks of the sequence axis.
    hs = hidden.reshape(b, n, c, d).swapaxes(0, 1)
    ts = targets.reshape(b, n, c).swapaxes(0, 1)

    def body(carry, xs):
        h, tgt = xs
        logits = unembed_logits(h, unembed)
        return carry, _logp_and_entropy(logits, tgt, temperature, want_entropy=True)

    # Without remat, scan would save every chunk's logits for the backward
    # pass, i.e. the full [B, T, V] we are avoiding.
    _, (logp, ent) = jax.lax.scan(jax.checkpoint(body, prevent_cse=False), None, (hs, ts))
    logp = logp.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    ent = ent.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    return logp, ent
