"""Attention kernels for the decoder: the grouped-query einsum path ("xla"),
jax.nn.dot_product_attention ("dpa" / cuDNN flash) and the Pallas TPU splash
kernel ("splash"), the dispatch between them (`attention_kind`, from
config.model.attention and the backend), and which keys each query may read
(`attention_masks`: training, prefill, and decode with a scalar or per-row
cache index).

Shapes: q f[B,T,Hq,Dh]; kt f[B,Hkv,Dh,S] (keys transposed) and v f[B,Hkv,S,Dh],
the KV cache's stored layouts (see KVCache); allowed bool[B,T,S] (query t may
read key s) -> f[B,T,Hq,Dh].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gdpo_jax.backend import effective_backend, target_backend
from gdpo_jax.models.config import ModelConfig
from gdpo_jax.models.kvcache import KVCache
from gdpo_jax.models.splash import splash_prompt_rows

# target_backend / effective_backend live in the leaf gdpo_jax.backend (core uses
# them too); re-exported here for existing imports.
__all__ = ["attention_kind", "attention_masks", "effective_backend", "target_backend"]

# Finite "minus infinity" for masked scores (see _attention: no NaN on empty rows).
_NEG = float(np.finfo(np.float32).min)


def attention_masks(
    mask: jax.Array, cache: KVCache | None, fresh_cache: bool = False
) -> tuple[jax.Array, jax.Array, bool, bool]:
    """Which keys each new query may read, for a call of T tokens.

    mask bool/int[B,T] (the new tokens' validity); cache: None (training: the
    T tokens attend to each other), a cache with a scalar index (the T tokens
    are written at slots index..index+T-1) or a per-row index int[B] (one
    token per row, row b at slot index[b]) -> (key_mask bool[B,S] (the cache's
    mask after this call's write; the new tokens' mask when cache is None),
    allowed bool[B,T,S] (query t may read key s; S = T when the call
    self-attends), self_attend, per_row).

    self_attend: the call attends to its own new k, v (no cache, or a fresh
    cache: a prefill at index 0 holds nothing to read; with a shared prompt,
    KVCache.prefix_*, its slots are read too).
    """
    T = mask.shape[1]
    valid = mask.astype(bool)
    causal = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]
    if cache is None:
        return valid, causal[None] & valid[:, None, :], True, False
    k_slot = jnp.arange(cache.mask.shape[1])
    if cache.index.ndim == 1:  # per row: row b writes its one token at slot index[b]
        if T != 1:
            raise ValueError(f"a per-row cache index takes one token per step, got T={T}.")
        if cache.prefix_k is not None and cache.prefix_cell is None:
            raise ValueError(
                "a per-row cache index reads a shared prompt only through prompt slots "
                "(KVCache.prefix_cell)."
            )
        key_mask = jnp.where(k_slot[None, :] == cache.index[:, None], valid, cache.mask)
        allowed = (k_slot[None, :] <= cache.index[:, None])[:, None, :] & key_mask[:, None, :]
        return key_mask, allowed, False, True
    key_mask = jax.lax.dynamic_update_slice(cache.mask, valid, (0, cache.index))
    if fresh_cache:  # nothing to read yet: the T tokens (after a shared prompt's slots)
        return key_mask, causal[None] & valid[:, None, :], True, False
    q_slot = cache.index + jnp.arange(T)
    allowed = (k_slot[None, :] <= q_slot[:, None])[None] & key_mask[:, None, :]  # [B,T,S]
    return key_mask, allowed, False, False


def _attention(
    q: jax.Array, kt: jax.Array, v: jax.Array, allowed: jax.Array, cfg: ModelConfig
) -> jax.Array:
    """q f[B,T,Hq,Dh], kt f[B,Hkv,Dh,S], v f[B,Hkv,S,Dh], allowed bool[B,T,S]
    -> f[B,T,Hq,Dh].

    GQA without repeating K/V: q is grouped [B,Hkv,G*T,Dh] so both dots are
    plain batched matmuls over (b, kv head) whose right operand is the cache
    as stored, in [contracted, free] order (q @ kt, p @ v).
    """
    B, T, Hq, Dh = q.shape
    Hkv = cfg.num_kv_heads
    G = Hq // Hkv
    # [B,T,Hkv,G,Dh] -> [B,Hkv,G,T,Dh] (small: only the T new tokens move).
    q = q.reshape(B, T, Hkv, G, Dh).transpose(0, 2, 3, 1, 4).reshape(B, Hkv, G * T, Dh)
    s = jnp.einsum("bkqd,bkds->bkqs", q, kt.astype(q.dtype), preferred_element_type=jnp.float32) * (
        Dh**-0.5
    )
    s = s.reshape(B, Hkv, G, T, -1)
    # Finite fill: fully masked rows (left padding) give uniform weights, not NaN.
    s = jnp.where(allowed[:, None, None], s, _NEG)
    p = jax.nn.softmax(s, axis=-1).astype(q.dtype).reshape(B, Hkv, G * T, -1)
    o = jnp.einsum("bkqs,bksd->bkqd", p, v.astype(q.dtype))
    return o.reshape(B, Hkv, G, T, Dh).transpose(0, 3, 1, 2, 4).reshape(B, T, Hq, Dh)


def _attention_shared_prefix(
    q: jax.Array,
    pkt: jax.Array,
    pv: jax.Array,
    prefix_mask: jax.Array,
    kt: jax.Array,
    v: jax.Array,
    allowed: jax.Array,
    cfg: ModelConfig,
    cell: jax.Array | None = None,
    group: int = 0,
) -> jax.Array:
    """`_attention` over [a shared prompt's slots | the row's own slots].

    q f[B,T,Hq,Dh]; the U prompts' cache pkt f[U,Hkv,Dh,P], pv f[U,Hkv,P,Dh],
    prefix_mask bool[U,P]; the rows' own kt f[B,Hkv,Dh,S], v f[B,Hkv,S,Dh],
    allowed bool[B,T,S] -> f[B,T,Hq,Dh]. Rows are prompt-major: row b reads
    prompt b // (B // U), and every query may read all of its prompt's valid
    slots (they precede its own).

    The R = B // U rows of a prompt query its slots together, as one matmul
    [R*G*T, Dh] @ [Dh, P] per (prompt, kv head): the prompt's cache is read
    once per step instead of once per row. One softmax over the concatenated
    scores keeps the maths of a per-row copy of the prompt (only the order of
    the output's f32 sum differs: prompt part + own part).

    cell i32[B] (continuous batching's lanes, `KVCache.prefix_cell`): the U
    entries are prompt slots of R = `group` cells each, and row b sits in cell
    cell[b] (slot cell[b] // R), or reads no slot (cell >= U * R: an idle lane,
    its output is finite and unused). The rows' queries are scattered into the
    [U, R] grid, the prompt part runs there as above, and its results are
    gathered back: the same per-row maths (empty cells add zero rows).
    """
    B, T, Hq, Dh = q.shape
    U, Hkv = pkt.shape[0], cfg.num_kv_heads
    G = Hq // Hkv
    R = B // U if cell is None else int(group)
    C = U * R  # grid cells
    scale = Dh**-0.5
    if cell is None:  # prompt-major rows: the grid is the batch

        def to_grid(x: jax.Array) -> jax.Array:
            return x

        def from_grid(x: jax.Array) -> jax.Array:
            return x

        row_prefix_mask = jnp.repeat(prefix_mask, R, axis=0, total_repeat_length=B)  # [B,P]
    else:
        at = jnp.clip(cell, 0, C - 1)  # an idle lane reads any cell (finite, unused)

        def to_grid(x: jax.Array) -> jax.Array:  # [B, ...] -> [C, ...], idle lanes dropped
            return jnp.zeros((C, *x.shape[1:]), x.dtype).at[cell].set(x, mode="drop")

        def from_grid(x: jax.Array) -> jax.Array:  # [C, ...] -> [B, ...]
            return x[at]

        row_prefix_mask = prefix_mask[at // R]
    qr = q.reshape(B, T, Hkv, G, Dh).transpose(0, 2, 3, 1, 4)  # [B,Hkv,G,T,Dh]
    # Prompt part: a prompt's rows stacked into the matmul's M dim.
    qp = to_grid(qr).reshape(U, R, Hkv, G * T, Dh).transpose(0, 2, 1, 3, 4)
    sp = jnp.einsum(
        "ukmd,ukds->ukms",
        qp.reshape(U, Hkv, R * G * T, Dh),
        pkt.astype(q.dtype),
        preferred_element_type=jnp.float32,
    )
    sp = sp.reshape(U, Hkv, R, G, T, -1).transpose(0, 2, 1, 3, 4, 5).reshape(C, Hkv, G, T, -1)
    sp = jnp.where(row_prefix_mask[:, None, None, None], from_grid(sp) * scale, _NEG)
    # Own part: as in _attention.
    so = jnp.einsum(
        "bkqd,bkds->bkqs",
        qr.reshape(B, Hkv, G * T, Dh),
        kt.astype(q.dtype),
        preferred_element_type=jnp.float32,
    )
    so = jnp.where(allowed[:, None, None], so.reshape(B, Hkv, G, T, -1) * scale, _NEG)
    n_prefix = sp.shape[-1]
    p = jax.nn.softmax(jnp.concatenate([sp, so], axis=-1), axis=-1).astype(q.dtype)
    pp = to_grid(p[..., :n_prefix]).reshape(U, R, Hkv, G * T, n_prefix).transpose(0, 2, 1, 3, 4)
    po = p[..., n_prefix:].reshape(B, Hkv, G * T, -1)
    # Both parts' sums in f32, rounded once (as one dot over all slots would be).
    op = jnp.einsum(
        "ukms,uksd->ukmd",
        pp.reshape(U, Hkv, R * G * T, n_prefix),
        pv.astype(q.dtype),
        preferred_element_type=jnp.float32,
    )
    op = op.reshape(U, Hkv, R, G * T, Dh).transpose(0, 2, 1, 3, 4).reshape(C, Hkv, G * T, Dh)
    oo = jnp.einsum("bkqs,bksd->bkqd", po, v.astype(q.dtype), preferred_element_type=jnp.float32)
    o = (from_grid(op) + oo).astype(q.dtype)
    return o.reshape(B, Hkv, G, T, Dh).transpose(0, 3, 1, 2, 4).reshape(B, T, Hq, Dh)


def _attention_prefix_kernel(
    q: jax.Array,
    pkt: jax.Array,
    pv: jax.Array,
    prefix_mask: jax.Array,
    kt: jax.Array,
    v: jax.Array,
    mask: jax.Array,
    kind: str,
) -> jax.Array:
    """`_attention_shared_prefix` for a fresh multi-token call (training's pass
    over shared prompts) through splash, cuDNN or jax's dot_product_attention ("dpa").

    q f[B,T,Hq,Dh]; the U prompts' cache pkt f[U,Hkv,Dh,P], pv f[U,Hkv,P,Dh],
    prefix_mask bool[U,P]; the T new tokens' own kt f[B,Hkv,Dh,T], v
    f[B,Hkv,T,Dh], mask {0,1}[B,T] -> f[B,T,Hq,Dh]. Rows are prompt-major.

    Each row's keys are its prompt's slots then its own: query t reads the
    prompt's valid slots and its own valid slots <= t. Splash runs a prompt's
    rows in one call over [prompt | row 0 | ... | row R-1] keys
    (`splash.splash_prompt_rows`: the prompt's K/V enter once). cuDNN / dpa get
    the prompt's K/V repeated to its R = B // U rows (the prompt's projections
    and MLP still run once; autodiff sums the repeat's gradient into it). Splash
    and cuDNN never materialize the [B, Hq, T, P + T] scores that the einsum path
    holds; "dpa" (jax's XLA implementation) does.
    """
    if kind == "splash":  # each prompt's K/V once, its rows in one kernel call
        return splash_prompt_rows(q, pkt, pv, prefix_mask, kt, v, mask)
    B, T = mask.shape
    U, P = prefix_mask.shape

    def rows(x: jax.Array) -> jax.Array:  # [U, ...] -> [B, ...], prompt u to its rows
        return jnp.repeat(x, B // U, axis=0, total_repeat_length=B)

    kt_all = jnp.concatenate([rows(pkt).astype(q.dtype), kt.astype(q.dtype)], axis=-1)
    v_all = jnp.concatenate([rows(pv).astype(q.dtype), v.astype(q.dtype)], axis=2)
    own = attention_masks(mask, None)[1]  # causal over the valid own slots
    prompt = jnp.broadcast_to(rows(prefix_mask).astype(bool)[:, None, :], (B, T, P))
    allowed = jnp.concatenate([prompt, own], axis=-1)
    return _dpa_attention(q, kt_all, v_all, allowed, "cudnn" if kind == "cudnn" else "xla")


# cuDNN flash attention's head-dim limit (jax's check_is_flash_attention), by GPU.
CUDNN_MAX_HEAD_DIM = {"hopper": 256, "older": 128}


def cudnn_head_dim_ok(head_dim: int, *, hopper: bool) -> bool:
    """Whether cuDNN flash attention takes `head_dim`: a multiple of 8, at most 256 on
    Hopper and later, 128 before."""
    limit = CUDNN_MAX_HEAD_DIM["hopper" if hopper else "older"]
    return head_dim % 8 == 0 and head_dim <= limit


def attention_kind(cfg: ModelConfig, backend: str | None = None) -> str:
    """The kernel cfg.attention picks on `backend` (default: effective_backend()).

    "auto": cuDNN flash attention on GPU when the compute dtype is bf16/f16 (its
    only dtypes) and the head dim one every GPU's cuDNN takes (a multiple of 8, <= 128),
    the splash kernel on TPU, else the einsum path ("xla").
    "cudnn" off GPU or in f32, and "splash" on GPU, are errors naming the field
    ("splash" on CPU runs the kernel in Pallas interpret mode: a slow reference
    for tests).
    """
    backend = backend or effective_backend()
    half = jnp.dtype(cfg.dtype) in (jnp.bfloat16, jnp.float16)
    if cfg.attention == "auto":
        cudnn = backend == "gpu" and half and cudnn_head_dim_ok(cfg.head_dim, hopper=False)
        return "cudnn" if cudnn else "splash" if backend == "tpu" else "xla"
    if cfg.attention == "cudnn" and (backend != "gpu" or not half):
        raise ValueError(
            f"model.attention='cudnn' needs a GPU and dtype bfloat16/float16 (backend "
            f"{backend!r}, dtype {cfg.dtype!r}); set config.model.attention='auto' or 'xla'."
        )
    if cfg.attention == "cudnn" and not cudnn_head_dim_ok(cfg.head_dim, hopper=True):
        raise ValueError(
            f"model.attention='cudnn' needs a head_dim that is a multiple of 8 and at most "
            f"{CUDNN_MAX_HEAD_DIM['hopper']} (128 before Hopper); this model's is "
            f"{cfg.head_dim}: set config.model.attention='auto' or 'xla'."
        )
    if cfg.attention == "splash" and backend not in ("tpu", "cpu"):
        raise ValueError(
            f"model.attention='splash' is a TPU kernel (backend {backend!r}); set "
            "config.model.attention='auto' or 'xla'."
        )
    return cfg.attention


def _dpa_attention(
    q: jax.Array, kt: jax.Array, v: jax.Array, allowed: jax.Array, implementation: str
) -> jax.Array:
    """`_attention` through jax.nn.dot_product_attention (q [B,T,Hq,Dh], kt
    [B,Hkv,Dh,S], v [B,Hkv,S,Dh], allowed bool[B,T,S]); GQA is native there (no
    K/V repeat).

    A query with no allowed key (a left-padding position) may attend to every
    key here, so no kernel sees an empty row (NaN); its output differs from the
    einsum path's (a plain mean of V) but is finite and never read: padding
    positions are masked out of every real query and of the loss.
    """
    T, S = q.shape[1], kt.shape[-1]
    pad_t, pad_s = (T % 2, S % 2) if implementation == "cudnn" else (0, 0)
    if pad_t or pad_s:
        # cuDNN's masked backward pass takes even lengths only ("Unsupported sequence
        # length"): an odd prompt bucket failed the train step's compile. A padded key is
        # allowed to no query; a padded query's row is cut off below.
        q = jnp.pad(q, ((0, 0), (0, pad_t), (0, 0), (0, 0)))
        kt = jnp.pad(kt, ((0, 0), (0, 0), (0, 0), (0, pad_s)))
        v = jnp.pad(v, ((0, 0), (0, 0), (0, pad_s), (0, 0)))
        allowed = jnp.pad(allowed, ((0, 0), (0, pad_t), (0, pad_s)))
    allowed = allowed | ~jnp.any(allowed, axis=-1, keepdims=True)
    k, v = kt.astype(q.dtype).transpose(0, 3, 1, 2), v.astype(q.dtype).transpose(0, 2, 1, 3)
    out = jax.nn.dot_product_attention(
        q, k, v, mask=allowed[:, None], implementation=implementation
    )
    return out[:, :T]
