"""One decoding step's token choice: temperature, top-k, top-p (nucleus), greedy.

Pure jnp, jit-friendly, sort-free for top-p (a full-vocabulary sort costs more
than a whole decode step of a small model on CPU).

Log-prob convention: the value returned for the chosen token is that of the
*tempered, unfiltered* distribution, ``log_softmax(logits / T)[token]``, as TRL
and verl use for "old" log-probs: the trainer recomputes ``log_softmax(logits /
T)`` of the policy, so the importance ratio at the first update is exactly 1
even when top-k / top-p truncated the proposal.

Filter semantics follow Hugging Face's warpers: temperature, then top-k, then
top-p renormalized over what top-k kept; the most likely token is always kept.
A token is in the nucleus iff the mass of the strictly more likely tokens is
< top_p (ties at the boundary are all kept). With top-k on, it is the mass of
the candidates top-k lists before it (top-k breaks ties by index, so of tied
tokens at the boundary the later-listed may be dropped).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from gdpo_jax.sampling import topk
from gdpo_jax.sharding import is_explicit


def first_argmax(x: jax.Array) -> jax.Array:
    """i32[B]: index of the first maximum along the last axis (max + min-index:
    two plain reductions, several times faster than argmax on CPU)."""
    m = jnp.max(x, axis=-1, keepdims=True)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where(x == m, iota, x.shape[-1]), axis=-1)


def _sortable_key(x: jax.Array) -> jax.Array:
    """i32 key with the same order as the f32 values (no NaNs)."""
    i = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    return jnp.where(i < 0, i ^ jnp.int32(0x7FFFFFFF), i)


# How many of the most likely tokens `nucleus_mask` tries before bisecting, off GPUs
# (XLA:CPU and TPU select any k with a partial selection).
NUCLEUS_CANDIDATES = 64
# Rows the bisection works on at a time, off GPUs. The rows whose nucleus lies beyond
# their candidates are gathered first (a few per batch at T 0.6), so that one such row
# does not make the whole batch bisect: a CPU's time grows with the rows it sums. A
# chunk is as few of BISECT_CHUNKS rows as hold the unsettled ones (one or two wide rows
# in a batch, the common case, bisect alone or as a pair, not padded to eight).
BISECT_ROWS = 8
BISECT_CHUNKS = (1, 2, 4, BISECT_ROWS)
# A GPU's time at these sizes is the loop's steps instead (kernel launches, and a
# while loop's predicate read back at each), and XLA:GPU's TopK kernel takes k <= 16
# (a larger k sorts the whole [B, V]). There the candidates (16) and the gathered
# rows made top-p 1.5-20x slower than 32 halvings of every row at once, and with 16
# candidates but no gathering still 1.1-1.5x slower (one H200, bench_token_choice):
# a GPU bisects every row in a fixed 32 steps (`_nucleus_bisected`).


def nucleus_mask(z: jax.Array, top_p: jax.Array | float) -> jax.Array:
    """bool[B, V]: tokens whose strictly-more-likely mass is < top_p.

    Exact without sorting the vocabulary. A row whose nucleus lies among its
    `NUCLEUS_CANDIDATES` most likely tokens (`topk.top_k`, a partial selection)
    takes its threshold from them. Other rows, `BISECT_ROWS` at a time, bisect over
    the 2^32 ordered f32 values of the threshold (up to 32 masked sums over the
    vocabulary). On a GPU every row bisects, 32 halvings at once. Either way a row's
    mask depends on its own logits only. At T 0.6 an LLM's nucleus is a few tokens;
    at [64, 49152] on XLA:CPU bisecting every row cost 40 ms per sampling step.

    Args:
      z: f32[B, V] tempered logits (any shift).
      top_p: f32[] in (0, 1].
    """
    z = z - jnp.max(z, axis=-1, keepdims=True)
    return _nucleus_of(z, jnp.exp(z), top_p)


def _nucleus_of(z: jax.Array, p: jax.Array, top_p: jax.Array | float) -> jax.Array:
    """`nucleus_mask` of z f32[B, V] with max 0 and p = exp(z)."""
    target = top_p * jnp.sum(p, axis=-1)
    return jax.lax.platform_dependent(
        z,
        p,
        target,
        cuda=_nucleus_bisected,
        rocm=_nucleus_bisected,
        default=_nucleus_from_candidates,
    )


def _below_all() -> jax.Array:
    """i32[]: a key below every f32's, -inf's too: mass(z > it) is the whole row's."""
    return _sortable_key(jnp.float32(-jnp.inf)) - 1


def _nucleus_from_candidates(z: jax.Array, p: jax.Array, target: jax.Array) -> jax.Array:
    """The nucleus mask bool[B, V] of z f32[B, V] (max 0), p = exp(z), target f32[B]
    (top_p * sum p), from the `NUCLEUS_CANDIDATES` most likely tokens where they hold
    it; the other rows bisect `BISECT_ROWS` gathered rows at a time."""
    k = min(NUCLEUS_CANDIDATES, z.shape[-1])
    vals, idx = topk.top_k(z, k)  # reductions only: a slice of it lowers to a sort
    pv = jnp.exp(vals)
    # Mass of the tokens strictly more likely than each candidate: all of them are
    # candidates (any other token is at most as likely as the least likely one).
    above = jnp.sum(jnp.where(vals[:, None, :] > vals[:, :, None], pv[:, None, :], 0.0), -1)
    # The most likely tokens (none above them) are always kept: a subnormal top_p
    # (< 1.2e-38) flushed target to 0 on XLA:CPU, the nucleus came out empty and every
    # row sampled token 0. The GPU's bisection keeps them already.
    kept = (above < target[:, None]) | (above == 0)  # [B, k]
    # A candidate left out (or every token a candidate): the threshold, the least
    # likely kept token, is a candidate. Otherwise it is below all of them.
    found = ~jnp.all(kept, axis=-1) | (k == z.shape[-1])
    hi = _sortable_key(jnp.min(jnp.where(kept, vals, jnp.inf), axis=-1))
    # Invariant: mass(z > lo) >= target > mass(z > hi); the threshold token t
    # satisfies lo < key(t) <= hi, so hi = lo + 1 is the answer.
    lo = jnp.where(found, hi - 1, _below_all())
    # top_k's first index, as a reduction over k: a slice of it lowers to a sort.
    top = jnp.min(jnp.where(jnp.arange(k) == 0, idx, z.shape[-1]), axis=-1)
    return _with_token(_sortable_key(z) >= _bisect_rows(z, p, target, lo, hi)[:, None], top)


def _with_token(mask: jax.Array, token: jax.Array) -> jax.Array:
    """mask bool[B, V] with each row's `token` i32[B] (its most likely) kept.

    Why: the threshold compares z with values another fusion computed (top_k's, or
    the max taken as 0). XLA may recompute z in each fusion that reads it, and two
    fusions can round it differently (seen at `--xla_backend_optimization_level=0`
    on 8 CPU devices): then even the most likely token fell a bit below the
    threshold, the mask was empty and the row sampled token 0. An integer compare
    cannot disagree so; with consistent roundings the token is in the mask already."""
    iota = jax.lax.broadcasted_iota(jnp.int32, mask.shape, 1)
    return mask | (iota == token[:, None])


def _nucleus_bisected(z: jax.Array, p: jax.Array, target: jax.Array) -> jax.Array:
    """`_nucleus_from_candidates`' mask with no candidates: every row bisects from
    (below all, the max's key], in 32 halvings (the span is at most 2^32 keys). A
    fixed trip count spares a GPU a while loop's predicate read back at each step."""
    # The rows' (lo, hi) laid out as `target` is (Explicit axes: its row sharding).
    hi = jnp.zeros_like(target, dtype=jnp.int32) + _sortable_key(jnp.float32(0.0))  # max 0
    lo = jnp.zeros_like(hi) + _below_all()
    body = functools.partial(_bisect_step, z, p, target)
    _, hi = jax.lax.fori_loop(0, 32, lambda _, c: body(c), (lo, hi))
    return _with_token(_sortable_key(z) >= hi[:, None], first_argmax(z))


def _bisect(
    z: jax.Array, p: jax.Array, target: jax.Array, lo: jax.Array, hi: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Bisects every row of z, p f32[R, V] until hi = lo + 1 (i32[R] keys, the
    invariant above); runs only while some row is unsettled."""
    body = functools.partial(_bisect_step, z, p, target)
    return jax.lax.while_loop(lambda c: jnp.any(c[1] - c[0] > 1), body, (lo, hi))


def _bisect_step(
    z: jax.Array, p: jax.Array, target: jax.Array, c: tuple[jax.Array, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    """One halving of every row's (lo, hi) i32[R]; a settled row (hi = lo + 1)
    stays as it is."""
    lo, hi = c
    mid = lo + (hi - lo) // 2
    mass = jnp.sum(jnp.where(_sortable_key(z) > mid[:, None], p, 0.0), axis=-1)
    ok = mass < target
    return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)


def bisect_chunk(unsettled: jax.Array) -> jax.Array:
    """i32[]: which of `BISECT_CHUNKS` the next gather takes for `unsettled` i32[] rows
    still to bisect: the fewest rows that hold them all, or the largest chunk."""
    sizes = jnp.asarray(BISECT_CHUNKS)
    return jnp.minimum(jnp.searchsorted(sizes, unsettled), sizes.size - 1).astype(jnp.int32)


def _bisect_rows(
    z: jax.Array, p: jax.Array, target: jax.Array, lo: jax.Array, hi: jax.Array
) -> jax.Array:
    """The settled hi i32[B] of `_bisect`, which runs on gathered rows: the first
    unsettled ones, as few of `BISECT_CHUNKS` as hold them (at most `BISECT_ROWS`),
    padded with settled rows (fixed points)."""
    if z.shape[0] <= BISECT_ROWS:
        return _bisect(z, p, target, lo, hi)[1]

    def settle(
        z: jax.Array, p: jax.Array, target: jax.Array, lo: jax.Array, hi: jax.Array
    ) -> jax.Array:
        def chunk(c: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            lo, hi = c
            unsettled = hi - lo > 1
            order = jnp.argsort(~unsettled, stable=True)  # unsettled first

            def first(n: int) -> Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
                def bisect(lo: jax.Array, hi: jax.Array) -> tuple[jax.Array, jax.Array]:
                    rows = order[:n]
                    lo_r, hi_r = _bisect(z[rows], p[rows], target[rows], lo[rows], hi[rows])
                    return lo.at[rows].set(lo_r), hi.at[rows].set(hi_r)

                return bisect

            which = bisect_chunk(jnp.sum(unsettled))
            return jax.lax.switch(which, [first(n) for n in BISECT_CHUNKS], lo, hi)

        return jax.lax.while_loop(lambda c: jnp.any(c[1] - c[0] > 1), chunk, (lo, hi))[1]

    if is_explicit(jax.sharding.get_abstract_mesh()):
        # Explicit axes: the chosen rows may come from any batch shard (a sort and a
        # gather across the row-sharded batch); GSPMD places them.
        settle = jax.sharding.auto_axes(settle, out_sharding=jax.typeof(hi).sharding)
    return settle(z, p, target, lo, hi)


def top_k_candidates(
    z: jax.Array, top_k: int, top_p: jax.Array | float | None
) -> tuple[jax.Array, jax.Array]:
    """The top-k tokens, then the nucleus among them (renormalized).

    Args:
      z: f32[B, V] tempered logits; top_k: static > 0; top_p: f32[] or None.

    Returns:
      (weights f32[B, K] unnormalized probabilities, 0 for dropped candidates,
       ids i32[B, K]) with K = min(top_k, V), most likely first.
    """
    k = min(int(top_k), z.shape[-1])
    vals, ids = topk.top_k(z, k)  # sorted descending (blocks on CPU: topk.py)
    # Shift by max(z), which equals vals[:, 0]: slicing top_k's output makes
    # XLA:CPU lower top_k to a full-vocabulary sort (20x slower on [64, 2048]).
    w = jnp.exp(vals - jnp.max(z, axis=-1, keepdims=True))
    if top_p is not None:
        probs = w / jnp.sum(w, axis=-1, keepdims=True)
        keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p
        keep = keep | (jnp.arange(k) == 0)[None, :]
        w = jnp.where(keep, w, 0.0)
    return w, ids.astype(jnp.int32)


def row_keys(key: jax.Array, rows: jax.Array, t: jax.Array | int) -> jax.Array:
    """Per-row PRNG keys [B]: ``fold_in(fold_in(key, row), t)`` for rows i32[B]
    (each row's id) at step t (a scalar, or i32[B], each row's own step).

    A row's draws then depend on its id and step only: not on the batch it
    ran in, its position there, the mesh, or (continuous batching) its lane.
    """
    t = jnp.asarray(t, jnp.int32)
    return jax.vmap(
        lambda r, s: jax.random.fold_in(jax.random.fold_in(key, r), s),
        in_axes=(0, 0 if t.ndim else None),
    )(rows, t)


# Widest block `inverse_cdf_sample` sums first. A cumsum over the whole vocabulary
# costs 15 ms per step at [64, 49152] on XLA:CPU; block sums, a cumsum over the
# blocks and one over the chosen block cost 0.3 ms.
CDF_BLOCK = 256


def _cdf_block(v: int) -> int:
    """The block width for a vocabulary of v: the largest power of two <= CDF_BLOCK
    dividing v, or CDF_BLOCK (the weights then padded) when that is under 32. Padding
    [64, 151936] weights made XLA:CPU's block sums 20x slower than the plain sum."""
    width = CDF_BLOCK
    while v % width:
        width //= 2
    return width if width >= 32 else CDF_BLOCK


def inverse_cdf_sample(key: jax.Array, weights: jax.Array) -> jax.Array:
    """i32[B]: index drawn with probability weights / sum (one uniform per row).

    The index is the first whose running sum exceeds u * total, u ~ U[0, 1).
    Running sums are taken in two levels: over blocks of weights (`_cdf_block`), then
    within the block u falls in (the same index as one cumsum, up to f32 rounding
    of the sums, and far cheaper: see `CDF_BLOCK`).

    Args:
      key: one PRNG key (a [B] draw), or one key per row ([B], e.g. `row_keys`).
      weights: f32[B, V] >= 0, each row with a positive sum.

    Never returns a zero-weight index (the chosen index is where a running sum rises).
    """
    rows, v = weights.shape
    width = _cdf_block(v)
    nb = -(-v // width)
    w = weights if nb * width == v else jnp.pad(weights, ((0, 0), (0, nb * width - v)))
    w = w.reshape(rows, nb, width)
    block_cdf = jnp.cumsum(jnp.sum(w, axis=-1), axis=-1)  # [B, nb], nondecreasing
    total = jnp.max(block_cdf, axis=-1, keepdims=True)
    if key.shape:
        u = jax.vmap(lambda k: jax.random.uniform(k, (1,), jnp.float32))(key) * total
    else:
        u = jax.random.uniform(key, total.shape, jnp.float32) * total
    # The block: first whose running sum exceeds u, at most the last with weight.
    last_block = jnp.sum(block_cdf < total, axis=-1)
    b = jnp.minimum(jnp.sum(block_cdf <= u, axis=-1), last_block)
    before = jnp.take_along_axis(block_cdf, jnp.maximum(b - 1, 0)[:, None], axis=-1)[:, 0]
    rest = u[:, 0] - jnp.where(b > 0, before, 0.0)  # >= 0: before <= u
    # Within it: the same rule; rounding may put `rest` past the block's own sum.
    cdf = jnp.cumsum(jnp.take_along_axis(w, b[:, None, None], axis=1)[:, 0], axis=-1)
    last = jnp.sum(cdf < jnp.max(cdf, axis=-1, keepdims=True), axis=-1)
    idx = jnp.minimum(jnp.sum(cdf <= rest[:, None], axis=-1), last)
    return (b * width + idx).astype(jnp.int32)


def sample_tokens(
    logits: jax.Array,
    key: jax.Array,
    temperature: jax.Array | float,
    top_p: jax.Array | float | None,
    *,
    top_k: int = 0,
    greedy: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Chooses one token per row.

    Args:
      logits: f[B, V] next-token logits (any float dtype; computed in f32).
      key: PRNG key for this step, or one per row ([B], `row_keys`); unused when greedy.
      temperature: f32[] > 0. Also used for the log-probs when greedy.
      top_p: f32[] or None (off; a static choice).
      top_k: static; 0 = off.
      greedy: static; first argmax of the logits.

    Returns:
      tokens i32[B], logp f32[B] = log_softmax(logits / temperature)[token]
      (tempered, before top-k/top-p filtering).
    """
    z = logits.astype(jnp.float32) / temperature
    z = z - jnp.max(z, axis=-1, keepdims=True)
    p = jnp.exp(z)
    log_total = jnp.log(jnp.sum(p, axis=-1))
    if greedy:
        tokens = first_argmax(logits.astype(jnp.float32))
    elif top_k > 0:
        w, ids = top_k_candidates(z, top_k, top_p)
        j = inverse_cdf_sample(key, w)
        tokens = jnp.take_along_axis(ids, j[:, None], axis=-1)[:, 0]
    else:
        if top_p is not None:
            p = jnp.where(_nucleus_of(z, p, top_p), p, 0.0)
        tokens = inverse_cdf_sample(key, p)
    logp = jnp.take_along_axis(z, tokens[:, None], axis=-1)[:, 0] - log_total
    return tokens, logp


def stop_sequence_hit(window: jax.Array, seqs: jax.Array) -> jax.Array:
    """Whether the most recent tokens end with any stop sequence.

    Args:
      window: i32[B, L] the last L generated tokens, oldest first; slots not yet
        generated hold -2 (never matches).
      seqs: i32[S, L] stop sequences right-aligned, left-padded with -1 (a
        wildcard: position not part of the sequence).

    Returns:
      bool[B].
    """
    if seqs.shape[0] == 0:
        return jnp.zeros(window.shape[:1], dtype=bool)
    match = (window[:, None, :] == seqs[None, :, :]) | (seqs[None, :, :] == -1)
    return jnp.any(jnp.all(match, axis=-1), axis=-1)
