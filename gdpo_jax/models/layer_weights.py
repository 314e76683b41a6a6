"""Per-layer views of the stacked layer weights ({name: f[L, ...]}).

layers = split_layers(model.param_arrays()["layers"], L)   # L dicts {name: f[...]}
fused = fuse_layer(layers[0])   # q/k/v -> "qkv_proj", gate/up -> "gate_up_proj"
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Weights concatenated on their output dim by `fuse_layer`.
FUSED: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "qkv_bias": ("q_bias", "k_bias", "v_bias"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def split_layers(layers: dict[str, jax.Array], n: int) -> tuple[dict[str, jax.Array], ...]:
    """{name: f[L, ...]} -> L dicts {name: f[...]} (one split per weight).

    `jnp.split`, not L indexings `v[i]`: autodiff transposes a split into one
    concatenate of the L layer gradients, where each `v[i]` transposes into a
    zero-padded [L, ...] gradient and the L of them are summed (O(L^2) memory
    traffic: the largest non-matmul cost of SmolLM2-135M's 30-layer fwd+bwd on
    XLA:CPU).
    """
    parts = {k: jnp.split(v, n, axis=0) for k, v in layers.items()}
    return tuple({k: p[i].reshape(p[i].shape[1:]) for k, p in parts.items()} for i in range(n))


def fuse_layer(layer: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """One layer's weights with q/k/v (and their biases) concatenated into "qkv_proj"
    f[D, (Hq+2Hkv)*Dh] and gate/up into "gate_up_proj" f[D, 2F]: a decode step then runs
    4 weight matmuls per layer instead of 7 (the same products; a wider matmul may block
    its f32 sums differently, ~1e-6). The other weights pass through unchanged.
    """
    out = dict(layer)
    for fused, names in FUSED.items():
        if names[0] in out:
            out[fused] = jnp.concatenate([out.pop(n) for n in names], axis=-1)
    return out
