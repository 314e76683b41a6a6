"""The compiled core of the sampler: prefill + a ``lax.while_loop`` decode.

One compiled function per (model graph, :class:`DecodeSpec`, mesh); inside it,
jit's own cache keys on the argument shapes (batch, prompt bucket) and
shardings. The weights are an *argument* (``nnx.State``), so a trainer's
updated parameters are used without recompiling and with no copy kept between
calls (the scan reads them in place; the unrolled forms copy them once per call).

Row-level semantics (B rows, prompt bucket P, M = max_new_tokens):
  * prompts are left padded; prompt positions are ``cumsum(mask) - 1`` and the
    t-th new token of a row sits at position ``prompt_len + t``;
  * the new token of step t goes to KV-cache slot ``P + t``; padded prompt slots
    are masked out of attention by the cache mask;
  * decoding runs in phases (``DecodeSpec.chunks``): phase j's steps read only
    ``P + chunks[0] + ... + chunks[j]`` slots, so early steps do not attend
    over (read) the empty tail of the cache. One phase = every step reads all
    ``P + M`` slots; more phases = less attention work, more compile time (one
    loop body per phase). ``DecodeSpec.growth`` says how a phase gets its
    slots: "prefix" holds one cache of all ``P + M`` slots from the start and
    phase j reads a static prefix of it (``KVCache.read_slots``): one phase's
    memory. "copy" starts with phase 0's slots and zero-pads the cache into
    a longer one at each phase; the step into a phase holds both (on a TPU
    about one more cache: docs/scale.md, "The static decode's phases"). The
    compiled TPU and GPU programs read the prefix in place (a dynamic-slice
    of the phase's slots on a TPU, a slice fused into the dot on a GPU;
    test_scale_plan checks the TPU program's reads). XLA:CPU copies a slice
    out for its dots, which slows the unrolled forms, so
    `decode_growth_default` keeps "copy" for them on CPU;
  * a row finishes on an EOS id (code 1), a stop token id or a stop token
    sequence (code 2), or after M tokens (code 0, "length"); finished rows emit
    ``pad_id`` with log-prob 0 and stop counting length;
  * the loop exits as soon as every row has finished;
  * ``DecodeSpec.layers``: "scan" (the layers' ``scan`` over the stacked
    cache and weights), "unrolled" (the loop carries an unstacked cache, one
    buffer per layer, and the layers' weights sliced once per call; the layers
    run unrolled) or "fused" (unrolled, with q/k/v and gate/up concatenated
    once per call: 4 weight matmuls per layer instead of 7). The default
    (`decode_layers_default`) is "fused" on CPU in f32 on one device,
    "unrolled" on CPU in f32 under a mesh (concatenating would mix "tensor"
    shards), "fused" on one GPU in bf16 / f16, else "scan". Under the stacked
    layer ``scan`` XLA:CPU copies every layer's weight and cache slices out of
    the stacked arrays at every step (a quarter of the compute in a trace of
    ``bench_sampler``'s decode). The unrolled forms copy the weights once per
    call in the compute dtype (`weights_in`): on one H200 at R1-Distill-1.5B's
    shapes (f32 weights, bf16 compute) the fused form decoded 2.4x faster than
    the scan, rows and log-probs bit-equal (docs/benchmarks.md). TPUs and
    several GPUs keep the scan (not measured), and so does a bf16 model on
    CPU: XLA:CPU fuses the unrolled graph differently and, with its
    excess-precision rewrites, skips bf16 roundings that the trainer's scan
    makes, so the sampler's log-probs would drift from the trainer's (by 0.02
    in test_sampler_logprobs_equal_trainer_logprobs). Prefill keeps the scan
    either way.
  * ``DecodeSpec.group`` = G > 0 (rows prompt-major, G per prompt, no batch
    padding): the prompts' prefilled cache is kept once per prompt as the
    cache's shared prefix (``KVCache.prefix_*``) and the rows' cache holds only
    their M new slots; each step reads a prompt's slots once for its G rows
    (one [G*Hq/Hkv, Dh] @ [Dh, P] matmul per prompt and kv head) instead of
    G copies. Prompt KV memory and reads drop G-fold: the bulk of decode
    traffic when prompts are long (tool calling: 2048-token prompts). Same
    maths: one softmax over [prompt | own] slots (f32 sums in another order).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from gdpo_jax.backend import effective_backend
from gdpo_jax.core.logprobs import unembed_logits
from gdpo_jax.models.kvcache import KVCache
from gdpo_jax.sampling.filters import row_keys, sample_tokens, stop_sequence_hit
from gdpo_jax.sampling.params import (
    DECODE_GROWTH,
    DECODE_LAYERS,
    FINISH_EOS,
    FINISH_LENGTH,
    FINISH_STOP,
)
from gdpo_jax.sharding import BATCH_AXES, batch_axes, constrain, is_explicit
from gdpo_jax.sharding import batch_axis_size as batch_shards

# BATCH_AXES, batch_axes and batch_shards are re-exported for existing imports.
__all__ = [
    "BATCH_AXES",
    "FINISH_EOS",
    "FINISH_LENGTH",
    "FINISH_STOP",
    "DecodeSpec",
    "batch_axes",
    "batch_shards",
    "make_generate_fn",
    "weights_in",
    "DECODE_GROWTH",
    "DECODE_LAYERS",
    "decode_growth_default",
    "decode_chunks",
    "decode_layers_default",
    "shared_prompt_group",
]


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """Static (compile-time) part of a generate call; hashable."""

    max_new_tokens: int
    chunks: tuple[int, ...]  # decode phases (sum = max_new_tokens), see make_generate_fn
    top_k: int
    use_top_p: bool
    greedy: bool
    pad_id: int
    layers: str = "scan"  # one of DECODE_LAYERS (module docstring)
    # Rows per prompt when every prompt has exactly `group` rows, prompt-major
    # (B = U * group): the prompts' cache is shared, not copied per row
    # (module docstring). 0: a per-row copy (any row_prompt).
    group: int = 0
    # How a phase gets its slots: "prefix" (one cache of all slots, phase j
    # reads its first ones) or "copy" (a longer cache per phase); docstring.
    growth: str = "prefix"


def decode_chunks(max_new_tokens: int, phases: int | None = None) -> tuple[int, ...]:
    """``DecodeSpec.chunks``: `max_new_tokens` split into `phases` near-equal decode
    phases (default: one per 32 tokens, at most 4), each at least one token."""
    m = int(max_new_tokens)
    n = max(1, min(phases or min(4, -(-m // 32)), m))
    return tuple(m // n + (i < m % n) for i in range(n))


def shared_prompt_group(enabled: bool, rows: int, prompts: int, group: int) -> int:
    """``DecodeSpec.group`` of a call of `rows` rows for `prompts` prompts of
    `group` rows each: `group` when the prompts' cache can be shared (every
    prompt has its rows, no batch-padding rows), else 0 (per-row copies)."""
    return group if enabled and rows == prompts * group else 0


def decode_layers_default(compute_dtype: Any, one_device: bool) -> str:
    """``DecodeSpec.layers`` by default: unrolled on CPU in f32 (fused on one
    device), fused on one GPU in bf16 / f16, else the scan (module docstring)."""
    backend, dtype = effective_backend(), jnp.dtype(compute_dtype)
    if backend == "gpu" and one_device and dtype in (jnp.bfloat16, jnp.float16):
        return "fused"
    if backend != "cpu" or dtype != jnp.float32:
        return "scan"
    return "fused" if one_device else "unrolled"


def decode_growth_default(layers: str) -> str:
    """``DecodeSpec.growth`` by default: "copy" for the unrolled forms on CPU
    (XLA:CPU copies a prefix slice out for its dots), else "prefix" (module
    docstring)."""
    return "copy" if effective_backend() == "cpu" and layers != "scan" else "prefix"


def weights_in(state: Any, dtype: Any) -> Any:
    """`state` with its floating arrays in `dtype` (the others as they are)."""
    dt = jnp.dtype(dtype)

    def cast(x):
        floating = jnp.issubdtype(x.dtype, jnp.floating)
        return x.astype(dt) if floating and x.dtype != dt else x

    return jax.tree.map(cast, state)


def _spec(
    x: jax.Array, mesh: jax.sharding.Mesh | None, batch_dim: int, heads_dim: int | None = None
) -> P:
    """Batch dim over ("data","fsdp") (heads over "tensor") where they divide, else replicated."""
    parts: list[Any] = [None] * x.ndim
    if mesh is None:
        return P(*parts)
    axes = batch_axes(mesh)
    if axes and x.shape[batch_dim] % batch_shards(mesh) == 0:
        parts[batch_dim] = axes
    tp = dict(mesh.shape).get("tensor", 1)
    if heads_dim is not None and tp > 1 and x.shape[heads_dim] % tp == 0:
        parts[heads_dim] = "tensor"
    return P(*parts)


def grow_cache(
    cache: KVCache, slots: int, place: Callable[[jax.Array], jax.Array] = lambda x: x
) -> KVCache:
    """The cache with `slots` slots: k, v and mask zero-padded on their slot axis
    (one copy; the new slots are masked out). Stacked or per-layer buffers;
    `place` lays out each padded leaf (a sharding constraint, or nothing)."""

    def pad(x: jax.Array, dim: int) -> jax.Array:
        widths = [(0, 0)] * x.ndim
        widths[dim] = (0, slots - x.shape[dim])
        return place(jnp.pad(x, widths))

    off = 0 if cache.is_stacked else 1  # per-layer buffers have no [L] axis
    pad_all = lambda xs, dim: (  # noqa: E731
        pad(xs, dim) if cache.is_stacked else tuple(pad(x, dim) for x in xs)
    )
    return cache.replace(
        k=pad_all(cache.k, KVCache.K_SLOT_AXIS - off),
        v=pad_all(cache.v, KVCache.V_SLOT_AXIS - off),
        mask=pad(cache.mask, KVCache.MASK_SLOT_AXIS),
    )


def make_generate_fn(
    graphdef: nnx.GraphDef,
    spec: DecodeSpec,
    mesh: jax.sharding.Mesh | None,
    on_trace: Callable[[], None] | None = None,
) -> Callable[..., dict[str, jax.Array]]:
    """Builds the jitted ``generate(state, prompt_ids, ...) -> dict`` function.

    Returned function arguments:
      state: nnx.State of the model (the policy's live, possibly sharded weights).
      prompt_ids i32[U, P], prompt_mask i32[U, P]: the U distinct prompts, left
        padded, >= 1 token each; prefilled once each.
      row_prompt i32[B]: the prompt of each of the B rows (G-fold expansion).
      active bool[B]: False for batch-padding rows (finished from the start).
      key: PRNG key; row r samples its t-th token with
        ``row_keys(key, row_ids[r], t)`` (filters.py): its id and step only.
      temperature f32[], top_p f32[]: traced, changing them does not recompile.
      eos_ids i32[E], stop_ids i32[S1]: finish with "eos" / "stop".
      stop_seqs i32[S2, L]: right-aligned token sequences, -1 padded on the left.
      row_limit i32[B]: per-row token budget (<= M); a row reaching it ends
        with finish "length".
      row_ids i32[B] (optional, 0..B-1): each row's id, its random stream. The
        Sampler numbers a call's rows by their place in the whole batch (its
        chunks, its processes), so their draws equal one call's over that batch.

    Returns a dict: tokens i32[B, M], logprobs f32[B, M] (tempered, unfiltered),
    finish i32[B] (0 length, 1 eos, 2 stop), lengths i32[B] (tokens incl. the
    EOS/stop token), steps i32[] (decode iterations run).
    """
    m_new = spec.max_new_tokens

    def place(x: jax.Array, batch_dim: int = 0, heads_dim: int | None = None) -> jax.Array:
        return constrain(x, mesh, _spec(x, mesh, batch_dim, heads_dim))

    def place_cache_leaf(x: jax.Array) -> jax.Array:
        # KVCache leaves: k [L,B,Hkv,Dh,S], v [L,B,Hkv,S,Dh] (heads over
        # "tensor", as the model's own init_cache lays them out), or per layer
        # (unstacked) [B,Hkv,Dh,S] / [B,Hkv,S,Dh]; mask [B,S]; index [].
        if x.ndim == 0:
            return x
        if x.ndim == 5:
            return place(x, 1, 2)
        return place(x, 0, 1) if x.ndim == 4 else place(x)

    def gather_rows(x: jax.Array, idx: jax.Array, dim: int) -> jax.Array:
        fn = lambda x, i: jnp.take(x, i, axis=dim)  # noqa: E731
        if is_explicit(mesh):
            out = jax.ShapeDtypeStruct(x.shape[:dim] + idx.shape + x.shape[dim + 1 :], x.dtype)
            fn = jax.sharding.auto_axes(fn, out_sharding=_spec(out, mesh, dim))
        return fn(x, idx)

    def unembed(h: jax.Array, w: jax.Array) -> jax.Array:
        # The model's and the trainer's numerics (one function): compute dtype in, f32 out.
        fn = unembed_logits
        if is_explicit(mesh):
            # Explicit axes: let GSPMD pick the matmul layout (w is fsdp/tensor split).
            out = jax.ShapeDtypeStruct((h.shape[0], w.shape[1]), jnp.float32)
            fn = jax.sharding.auto_axes(fn, out_sharding=_spec(out, mesh, 0))
        return fn(h, w)

    def forward(state, ids, mask, positions, cache, *, last_only: bool, layer_params=None):
        # Merge inside each (loop) trace: the module is a fresh view of `state`,
        # so no module crosses trace levels (`layer_params`, plain arrays, may).
        model = nnx.merge(graphdef, state)
        if last_only:
            # Prefill into a fresh cache: unembed only the last position (never
            # [B, P, V] logits); the prompt attends to itself ([P, P] scores).
            hidden, cache = model(
                ids, mask, positions=positions, cache=cache, return_hidden=True, fresh_cache=True
            )
            logits = unembed(hidden[:, -1], model.unembed_matrix())
        else:
            logits, cache = model(
                ids, mask, positions=positions, cache=cache, layer_params=layer_params
            )
            logits = logits[:, -1]
        cache = jax.tree.map(place_cache_leaf, cache)
        return place(logits.astype(jnp.float32)), cache

    def grow(cache: KVCache, slots: int) -> KVCache:
        return grow_cache(cache, slots, place_cache_leaf)

    def generate(
        state,
        prompt_ids,
        prompt_mask,
        row_prompt,
        active,
        key,
        temperature,
        top_p,
        eos_ids,
        stop_ids,
        stop_seqs,
        row_limit,
        row_ids=None,
    ) -> dict[str, jax.Array]:
        if on_trace is not None:
            on_trace()
        n_prompts, plen = prompt_ids.shape
        batch = row_prompt.shape[0]
        row_limit = place(row_limit)  # laid out like the other per-row loop state
        if spec.layers != "scan":
            # These forms copy the weights once per call anyway: copy them in the
            # compute dtype, so no step re-casts (or re-reads) f32 weights. The
            # model casts every weight to that dtype before use, so the products
            # are the same (greedy rows and log-probs bit-equal the scan's on an
            # H200 in bf16, docs/benchmarks.md); f32 compute: nothing to cast.
            state = weights_in(state, nnx.merge(graphdef, state).cfg.dtype)
        model = nnx.merge(graphdef, state)
        # Prefill each distinct prompt once (G-fold fewer tokens than the rows),
        # then hand every row its prompt's last logits and either a copy of
        # its prompt's cache or (spec.group) the prompts' cache, shared.
        ends = [int(e) for e in np.cumsum(spec.chunks)]
        shared = spec.group > 0
        if shared and batch != n_prompts * spec.group:
            raise ValueError(
                f"DecodeSpec.group={spec.group} needs {n_prompts} prompts x {spec.group} rows, "
                f"got {batch} rows; use group=0 (a per-row prompt copy)."
            )
        # Shared: prefill only the prompt slots (the rows' own cache is apart).
        prefix_growth = spec.growth == "prefix" and len(ends) > 1
        first = ends[-1] if prefix_growth else ends[0]  # own slots the cache starts with
        prefill_slots = plen if shared else plen + first
        cache = jax.tree.map(place_cache_leaf, model.init_cache(n_prompts, prefill_slots))
        prompt_mask = prompt_mask.astype(jnp.int32)
        positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
        logits, cache = forward(state, prompt_ids, prompt_mask, positions, cache, last_only=True)
        prompt_len = jnp.sum(prompt_mask, axis=1)
        logits = place(gather_rows(logits, row_prompt, 0))
        prompt_len = place(gather_rows(prompt_len, row_prompt, 0))
        if shared:  # the prompts' cache as is; each row gets `first` empty slots
            own = model.init_cache(batch, first)
            cache = jax.tree.map(
                place_cache_leaf,
                own.replace(prefix_k=cache.k, prefix_v=cache.v, prefix_mask=cache.mask),
            )
        else:
            cache = jax.tree.map(
                lambda x: (
                    x
                    if x.ndim == 0
                    else place_cache_leaf(gather_rows(x, row_prompt, 1 if x.ndim == 5 else 0))
                ),
                cache,
            )
        layer_params = None
        if spec.layers != "scan":  # one copy of each per call, none per step
            cache = jax.tree.map(place_cache_leaf, cache.unstacked())
            layer_params = model.layer_params(fuse=spec.layers == "fused")
        top_p_arg = top_p if spec.use_top_p else None
        win = max(int(stop_seqs.shape[1]), 1)
        row_ids = place(jnp.arange(batch, dtype=jnp.int32) if row_ids is None else row_ids)

        def body(c):
            t = c["t"]
            tok, lp = sample_tokens(
                c["logits"],
                key if spec.greedy else row_keys(key, row_ids, t),
                temperature,
                top_p_arg,
                top_k=spec.top_k,
                greedy=spec.greedy,
            )
            live = ~c["done"]
            tok = jnp.where(live, tok, spec.pad_id).astype(jnp.int32)
            lp = jnp.where(live, lp, 0.0)
            window = jnp.concatenate([c["window"][:, 1:], tok[:, None]], axis=1)
            is_eos = jnp.isin(tok, eos_ids) if eos_ids.shape[0] else jnp.zeros_like(live)
            is_stop = stop_sequence_hit(window, stop_seqs)
            if stop_ids.shape[0]:
                is_stop = is_stop | jnp.isin(tok, stop_ids)
            fin = live & (is_eos | is_stop)
            fin_any = fin | (live & (c["lengths"] + 1 >= row_limit))  # per-row budget
            new = dict(
                t=t + 1,
                tokens=jax.lax.dynamic_update_slice(c["tokens"], tok[:, None], (0, t)),
                logprobs=jax.lax.dynamic_update_slice(c["logprobs"], lp[:, None], (0, t)),
                finish=jnp.where(fin, jnp.where(is_eos, FINISH_EOS, FINISH_STOP), c["finish"]),
                lengths=c["lengths"] + live.astype(jnp.int32),
                done=c["done"] | fin_any,
                window=window,
            )
            # Feed the token back (finished rows too: static shapes; their output is unused).
            pos = (prompt_len + t)[:, None]
            ones = jnp.ones_like(tok)[:, None]
            new["logits"], new["cache"] = forward(
                state,
                tok[:, None],
                ones,
                pos,
                c["cache"],
                last_only=False,
                layer_params=layer_params,
            )
            return new

        init = dict(
            t=jnp.zeros((), jnp.int32),
            tokens=place(jnp.full((batch, m_new), spec.pad_id, jnp.int32)),
            logprobs=place(jnp.zeros((batch, m_new), jnp.float32)),
            finish=place(jnp.full((batch,), FINISH_LENGTH, jnp.int32)),
            lengths=place(jnp.zeros((batch,), jnp.int32)),
            done=place(~active),
            window=place(jnp.full((batch, win), -2, jnp.int32)),
            logits=logits,
            cache=cache,
        )
        out = init
        for j, end in enumerate(ends):
            slots = end if shared else plen + end
            if prefix_growth:  # the phase reads the cache's first `slots` slots
                out["cache"] = out["cache"].replace(read_slots=slots)
            elif j:  # next phase: a longer cache (one copy), empty slots masked out
                out["cache"] = grow(out["cache"], slots)
            out = jax.lax.while_loop(
                lambda c, end=end: (c["t"] < end) & ~jnp.all(c["done"]), body, out
            )
        return dict(
            tokens=out["tokens"],
            logprobs=out["logprobs"],
            finish=out["finish"],
            lengths=out["lengths"],
            steps=out["t"],
        )

    return jax.jit(generate)
