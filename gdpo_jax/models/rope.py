"""Rotary position embeddings with the HF rope-scaling variants.

Frequencies follow transformers' `modeling_rope_utils` (default, linear,
llama3, yarn); rotation uses the "rotate_half" (non-interleaved) layout of HF
Llama/Qwen checkpoints. GGUF files store q/k rows permuted for llama.cpp's
interleaved layout; gguf.py undoes that so this module sees HF layout only.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from gdpo_jax.backend import effective_backend
from gdpo_jax.models.config import ModelConfig


def rope_frequencies(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies f32[head_dim/2] and the cos/sin scale (yarn's mscale).

    Computed in NumPy at trace time: constants, not parameters. The exponents
    `arange(0, dim, 2) / dim` are rounded to f32 as transformers' float32 torch rounds
    them (in f64, a head_dim of 24 gave frequencies 4 f32 steps off, cos 9e-3 off at
    position 131071); the powers run in f64 and are rounded once, then scaled as
    below. transformers' own f32 `pow` is within one step of the powers here (its
    math library's).
    """
    dim, base = cfg.head_dim, cfg.rope_theta
    inv64 = 1.0 / (float(base) ** _exponents(dim))
    inv_freq = inv64.astype(np.float32)
    rope = cfg.rope_scaling_dict()
    kind = rope.get("rope_type", "default")
    scale = 1.0
    # linear and yarn in f32, op for op as transformers' (NumPy keeps Python scalars
    # weak, so each op rounds to f32 as torch's does). llama3's smoothing subtracts
    # near-equal numbers, which amplifies any one-step difference: it stays in f64
    # (within 3 steps of transformers', where f32 ops from our f32 powers gave 5).
    if kind == "linear":
        inv_freq = inv_freq / np.float32(rope["factor"])
    elif kind == "llama3":
        factor = rope["factor"]
        low, high = rope["low_freq_factor"], rope["high_freq_factor"]
        old_len = rope.get("original_max_position_embeddings", cfg.max_position_embeddings)
        low_wavelen, high_wavelen = old_len / low, old_len / high
        inv_freq = inv64
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled)
    elif kind == "yarn":
        inv_freq, scale = _yarn(cfg, rope)
    return inv_freq.astype(np.float32), float(scale)


def _exponents(dim: int) -> np.ndarray:
    """f64[dim/2]: arange(0, dim, 2) / dim, the division in f32 (transformers')."""
    return (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)).astype(np.float64)


def _yarn(cfg: ModelConfig, rope: dict) -> tuple[np.ndarray, float]:
    dim, base = cfg.head_dim, cfg.rope_theta
    old_len = rope.get("original_max_position_embeddings", cfg.max_position_embeddings)
    factor = rope["factor"]  # required, as in transformers (ModelConfig checks it)

    def mscale(s: float, m: float = 1.0) -> float:
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    attn = rope.get("attention_factor")
    if attn is None:
        m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
    beta_fast, beta_slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

    def corr_dim(rot: float) -> float:
        return dim * math.log(old_len / (rot * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = corr_dim(beta_fast), corr_dim(beta_slow)
    if rope.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    pos = (float(base) ** _exponents(dim)).astype(np.float32)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - lo) / (hi - lo), 0, 1)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos)) * (1 - extra) + (1.0 / pos) * extra
    return inv, float(attn)


def rope_cos_sin(positions: jnp.ndarray, cfg: ModelConfig) -> tuple[jnp.ndarray, jnp.ndarray]:
    """positions i32[B,T] -> (cos, sin) f32[B,T,head_dim] (halves repeated, HF layout).

    Each angle's cosine and sine are computed once (on the half, then repeated).
    On CPU they are also materialized once per forward: XLA:CPU otherwise fuses
    (recomputes) them into every consumer, and with the layers unrolled (the
    sampler's decode) that was up to 3 fusions per layer each evaluating ``cos``
    and ``sin`` at every step (docs/benchmarks.md, "Where the sampler's time
    goes"). Values are unchanged.
    """
    inv_freq, scale = rope_frequencies(cfg)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    cos, sin = jnp.cos(angles) * scale, jnp.sin(angles) * scale
    cos, sin = jnp.concatenate([cos, cos], axis=-1), jnp.concatenate([sin, sin], axis=-1)
    if effective_backend() == "cpu":
        cos, sin = jax.lax.optimization_barrier((cos, sin))
    return cos, sin


def apply_rope(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
    """x f[B,T,H,Dh], cos/sin f32[B,T,Dh] -> rotated x (in f32, cast back)."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    out = xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)
