"""Exact top-k over a large vocabulary on XLA:CPU, through the blocks that hold it.

XLA:CPU runs `jax.lax.top_k` as one `TopK` custom call, on one thread, whose time
grows with the whole row. `top_k` here cuts each row into blocks of w tokens and keeps
the k blocks with the largest maxima: every one of the row's k largest tokens lies in
them (a token in another block has k blocks' maxima above it, so k tokens above it).
One TopK over the blocks' maxima and one over the k * w tokens of the kept blocks read
about 2 sqrt(k V) elements per row instead of V. Top-k sampling and top-p's
candidates (`filters.py`) select so; `python -m benchmarks.bench_top_k` times both
forms (docs/benchmarks.md, "Top-k through blocks"). Below `BLOCKS_MIN_VOCAB` tokens
the second call's fixed cost outweighs what it saves, and XLA:CPU's one call stays.

The values and the ids are those of `jax.lax.top_k`, ties included: the kept blocks
are read in token order, so of equal values the lower id comes first, as TopK orders
them. Other platforms keep `jax.lax.top_k` (a GPU's and a TPU's selection kernels
were not measured in this form).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

__all__ = ["BLOCKS_MIN_VOCAB", "block_width", "top_k", "top_k_by_blocks"]

# Vocabularies from which XLA:CPU's top-k goes through blocks: on a 2-core AMD EPYC
# (avx2; `bench_top_k`, docs/benchmarks.md) they lost at 2,048 tokens, about broke
# even at 4,096 and were faster from 8,192.
BLOCKS_MIN_VOCAB = 8192
MIN_BLOCK = 8  # narrower blocks read more maxima than they save tokens


def block_width(vocab: int, k: int, min_vocab: int | None = None) -> int:
    """The block width `top_k` uses for rows of `vocab` tokens: the largest power of
    two dividing `vocab` that is at most 2 sqrt(vocab / k) (the two calls then read
    about vocab / w + k w elements, least near w = sqrt(vocab / k)), or 0 where
    `vocab` < `min_vocab` (default `BLOCKS_MIN_VOCAB`, read at each call), no such
    width of at least `MIN_BLOCK` divides it, or the kept blocks would hold the row."""
    min_vocab = BLOCKS_MIN_VOCAB if min_vocab is None else min_vocab
    if vocab < min_vocab or k < 1:
        return 0
    limit = 2 * math.sqrt(vocab / k)
    w = 1
    while 2 * w <= limit and vocab % (2 * w) == 0:
        w *= 2
    return w if w >= MIN_BLOCK and k * w < vocab else 0


def top_k(z: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """`jax.lax.top_k(z, k)` for z f[B, V]: (values f[B, k] descending, ids i32[B, k]),
    equal ones by ascending id. On CPU through blocks where `block_width` gives one."""
    w = block_width(z.shape[-1], k)
    if not w:
        return tuple(jax.lax.top_k(z, k))
    return jax.lax.platform_dependent(
        z,
        cpu=functools.partial(top_k_by_blocks, k=k, width=w),
        default=lambda z: tuple(jax.lax.top_k(z, k)),
    )


def top_k_by_blocks(z: jax.Array, k: int, width: int) -> tuple[jax.Array, jax.Array]:
    """`top_k` of z f[B, V] through the k blocks of `width` tokens with the largest
    maxima (V a multiple of `width`)."""
    rows, v = z.shape
    blocks = z.reshape(rows, v // width, width)
    _, kept = jax.lax.top_k(jnp.max(blocks, axis=-1), k)  # [B, k] block ids
    # In token order, so that the second call's ties (by position) are by token id.
    kept = jnp.sort(kept, axis=-1)
    cand = jnp.take_along_axis(blocks, kept[:, :, None], axis=1).reshape(rows, k * width)
    vals, pos = jax.lax.top_k(cand, k)
    ids = jnp.take_along_axis(kept, pos // width, axis=-1) * width + pos % width
    return vals, ids.astype(jnp.int32)
