"""The Pallas TPU splash-attention kernel for the model's multi-token calls
(model.attention="splash", or "auto" on a TPU).

Two layouts:

* `splash_attention`: causal self-attention over one call's T tokens, one
  kernel call per row (training's per-row forward, a fresh prefill).
* `splash_prompt_rows`: training's pass over shared prompts
  (`models.prompt_sharing`). The R rows of a prompt run as one kernel call
  whose keys are [the prompt's P slots | row 0's T | ... | row R-1's T] under a
  static block mask (`prompt_rows_mask`): row r's queries read the prompt and
  their own keys up to themselves. Each prompt's K/V enter once and their
  gradient is accumulated inside the kernel, instead of the K/V repeated to
  every row (a [B, Hkv, P, Dh] copy and its gradient per layer). Off-diagonal
  blocks (row r's queries, row r' != r's keys) are empty, so the kernel's
  shrunken grid skips them: the work is the per-row layout's.

Padding is a segment id (1 valid token, 0 padding): a valid query reads only
valid keys, a padding query reads padding (finite, never read). GQA runs the
multi-query kernel once per kv head (vmapped), so K/V are never repeated across
heads. Sequences are padded to SPLASH_BLOCK inside each shard. Under a mesh
the kernel runs per shard (`jax.shard_map`: batch over ("data", "fsdp"), heads
over "tensor" when both head counts divide it; a Pallas call cannot be
partitioned by XLA). Off TPU it runs in Pallas interpret mode (a slow
reference for tests).

Shapes: q f[B,T,Hq,Dh]; kt f[B,Hkv,Dh,T] (keys transposed), v f[B,Hkv,T,Dh]
(the KV cache's layouts); mask {0,1}[B,T] -> f[B,T,Hq,Dh].
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gdpo_jax.backend import effective_backend
from gdpo_jax.sharding import BATCH_AXES, batch_axis_size, context_mesh, sanitize_spec

__all__ = [
    "SPLASH_BLOCK",
    "block_ceil",
    "prompt_rows_mask",
    "splash_attention",
    "splash_prompt_rows",
]

# Splash kernel blocks: sequences are padded up to a multiple of this.
SPLASH_BLOCK = 128


def _splash_modules() -> tuple[Any, Any]:
    # Imported here: Pallas's TPU ops load only for a model that uses the kernel.
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernel,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as masks,
    )

    return kernel, masks


def block_ceil(n: int) -> int:
    """n rounded up to a multiple of SPLASH_BLOCK (the width the kernel runs on)."""
    return -(-n // SPLASH_BLOCK) * SPLASH_BLOCK


@functools.cache
def _prompt_rows_class() -> type:
    _, masks = _splash_modules()

    class PromptRows(masks._ComputableMask):  # splash's lazily computed masks
        """See `prompt_rows_mask`."""

        def __init__(self, rows: int, prompt: int, row_len: int) -> None:
            self.key = (rows, prompt, row_len)

            def fn(q_ids: Any, kv_ids: Any) -> Any:  # NumPy (block info) or in-kernel
                own = kv_ids - prompt
                if isinstance(own, np.ndarray):
                    row = np.maximum(own, 0) // row_len == q_ids // row_len
                else:  # truncating division of non-negatives: `//` lowers through
                    # sign(), which asks the TPU generation (none when compiling
                    # ahead of time for an abstract chip)
                    row = jax.lax.div(jnp.maximum(own, 0), row_len) == jax.lax.div(q_ids, row_len)
                return (own < 0) | (row & (own <= q_ids))

            super().__init__(shape=(rows * row_len, prompt + rows * row_len), mask_function=fn)

        def __eq__(self, other: object) -> bool:
            return isinstance(other, PromptRows) and self.key == other.key

        def __hash__(self) -> int:
            return hash((PromptRows, self.key))

    return PromptRows


def prompt_rows_mask(rows: int, prompt: int, row_len: int) -> Any:
    """The static [rows * row_len, prompt + rows * row_len] splash mask of
    `splash_prompt_rows`: query i (row i // row_len, position i % row_len) reads
    every prompt slot s < prompt and key prompt + j when j is in its row and
    j <= i. prompt and row_len are multiples of SPLASH_BLOCK, so a row's keys
    start and end on block boundaries (only its diagonal blocks are partial).
    """
    return _prompt_rows_class()(rows, prompt, row_len)


def _kernel_calls(
    qh: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array, kv_seg: jax.Array, head_mask: Any
) -> jax.Array:
    """One splash MQA call per (n, kv head): qh f[N,Hkv,G,Tq,Dh] (scaled), k, v
    f[N,Hkv,S,Dh], seg i32[N,Tq], kv_seg i32[N,S] -> f[N,Hkv,G,Tq,Dh]."""
    kernel_lib, masks = _splash_modules()
    kernel = kernel_lib.make_splash_mqa(
        masks.MultiHeadMask([head_mask] * qh.shape[2]),
        head_shards=1,
        q_seq_shards=1,
        interpret=effective_backend() != "tpu",
    )

    def one(qb, kb, vb, sb, kvb):  # [Hkv,G,Tq,Dh], [Hkv,S,Dh] x2, [Tq], [S]
        ids = kernel_lib.SegmentIds(q=sb, kv=kvb)
        return jax.vmap(lambda qh_, kh_, vh_: kernel(qh_, kh_, vh_, segment_ids=ids))(qb, kb, vb)

    return jax.vmap(one)(qh, k, v, seg, kv_seg)


def _pad_axis(x: jax.Array, axis: int, to: int) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, to - x.shape[axis])
    return jnp.pad(x, widths)


def _scaled_heads(q: jax.Array, Hkv: int) -> jax.Array:
    """q f[B,T,Hq,Dh] -> f[B,T,Hkv,G,Dh] scaled by Dh^-1/2 (the kernel does not scale)."""
    B, T, Hq, Dh = q.shape
    return (q * jnp.asarray(Dh**-0.5, q.dtype)).reshape(B, T, Hkv, Hq // Hkv, Dh)


def _self_local(q: jax.Array, kt: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """`splash_attention` on one device's (or shard's) arrays."""
    _, masks = _splash_modules()
    B, T, Hq, Dh = q.shape
    Hkv, Tp = kt.shape[1], block_ceil(T)
    # A padded query reads padding (block padding is segment 0, as padding tokens).
    qh = _pad_axis(_scaled_heads(q, Hkv).transpose(0, 2, 3, 1, 4), 3, Tp)  # [B,Hkv,G,Tp,Dh]
    k = _pad_axis(kt.astype(q.dtype).transpose(0, 1, 3, 2), 2, Tp)
    vv = _pad_axis(v.astype(q.dtype), 2, Tp)
    seg = _pad_axis(mask.astype(jnp.int32), 1, Tp)
    o = _kernel_calls(qh, k, vv, seg, seg, masks.CausalMask((Tp, Tp)))[:, :, :, :T]
    return o.transpose(0, 3, 1, 2, 4).reshape(B, T, Hq, Dh).astype(q.dtype)


def _prompt_rows_local(
    q: jax.Array,
    pkt: jax.Array,
    pv: jax.Array,
    prefix_mask: jax.Array,
    kt: jax.Array,
    v: jax.Array,
    mask: jax.Array,
) -> jax.Array:
    """`splash_prompt_rows` on one device's (or shard's) arrays."""
    B, T, Hq, Dh = q.shape
    U, Hkv, _, P = pkt.shape
    R, G, Tp = B // U, Hq // Hkv, block_ceil(T)
    # Row-major within a prompt: query / own key r * Tp + t is row r's token t.
    qh = _pad_axis(_scaled_heads(q, Hkv), 1, Tp).reshape(U, R, Tp, Hkv, G, Dh)
    qh = qh.transpose(0, 3, 4, 1, 2, 5).reshape(U, Hkv, G, R * Tp, Dh)

    def own(x: jax.Array) -> jax.Array:  # f[B,Hkv,T,Dh] -> f[U,Hkv,R*Tp,Dh]
        x = _pad_axis(x.astype(q.dtype), 2, Tp).reshape(U, R, Hkv, Tp, Dh)
        return x.transpose(0, 2, 1, 3, 4).reshape(U, Hkv, R * Tp, Dh)

    k = jnp.concatenate(
        [pkt.astype(q.dtype).transpose(0, 1, 3, 2), own(kt.transpose(0, 1, 3, 2))], 2
    )
    vv = jnp.concatenate([pv.astype(q.dtype), own(v)], 2)
    seg = _pad_axis(mask.astype(jnp.int32), 1, Tp).reshape(U, R * Tp)
    kv_seg = jnp.concatenate([prefix_mask.astype(jnp.int32), seg], 1)
    o = _kernel_calls(qh, k, vv, seg, kv_seg, prompt_rows_mask(R, P, Tp))  # [U,Hkv,G,R*Tp,Dh]
    o = o.reshape(U, Hkv, G, R, Tp, Dh)[:, :, :, :, :T]
    return o.transpose(0, 3, 4, 1, 2, 5).reshape(B, T, Hq, Dh).astype(q.dtype)


def _per_shard(
    local: Callable[..., jax.Array], args: Sequence[jax.Array], layouts: Sequence[str]
) -> jax.Array:
    """local(*args) under the context mesh, one call per shard. layouts name
    each argument's axes: "q" [B,T,H,Dh], "kv" [B,H,.,.], "mask" [B,T]; the
    first argument's layout is the output's."""
    mesh = context_mesh()
    if mesh is None:
        return local(*args)
    Hq, Hkv = args[0].shape[2], args[1].shape[1]
    tensor = dict(mesh.shape).get("tensor", 1)
    heads = "tensor" if Hq % tensor == 0 and Hkv % tensor == 0 else None
    axes = {
        "q": (BATCH_AXES, None, heads, None),
        "kv": (BATCH_AXES, heads, None, None),
        "mask": (BATCH_AXES, None),
    }
    specs = tuple(sanitize_spec(axes[a], x.shape, mesh) for a, x in zip(layouts, args))
    # check_vma=False: the kernel's pallas_call declares no per-axis variance.
    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=specs[0], check_vma=False)(
        *args
    )


def splash_attention(q: jax.Array, kt: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Causal self-attention over one call's T tokens (no cache): q f[B,T,Hq,Dh],
    kt f[B,Hkv,Dh,T], v f[B,Hkv,T,Dh], mask {0,1}[B,T] -> f[B,T,Hq,Dh].

    Token t reads the keys s <= t of its segment, so a valid token reads exactly
    the valid keys before it (as the einsum path). The kernel never materializes
    the [T, T] scores (the einsum path's largest temporary in training).
    """
    return _per_shard(_self_local, (q, kt, v, mask), ("q", "kv", "kv", "mask"))


def splash_prompt_rows(
    q: jax.Array,
    pkt: jax.Array,
    pv: jax.Array,
    prefix_mask: jax.Array,
    kt: jax.Array,
    v: jax.Array,
    mask: jax.Array,
) -> jax.Array:
    """Training's fresh pass over shared prompts: row b's T queries read its
    prompt's valid slots and its own valid keys <= t.

    q f[B,T,Hq,Dh]; the U prompts' cache pkt f[U,Hkv,Dh,P], pv f[U,Hkv,P,Dh]
    (P a multiple of SPLASH_BLOCK: `models.prompt_sharing` pads the prompt's
    tokens), prefix_mask {0,1}[U,P]; the rows' own kt f[B,Hkv,Dh,T], v
    f[B,Hkv,T,Dh], mask {0,1}[B,T] -> f[B,T,Hq,Dh]. Rows are prompt-major
    (B = U * R; under a mesh each shard holds whole prompts).
    """
    if pkt.shape[-1] % SPLASH_BLOCK:
        raise ValueError(
            f"splash over a shared prompt needs its cache width ({pkt.shape[-1]}) a multiple "
            f"of {SPLASH_BLOCK}; pad the prompt's tokens (models.prompt_sharing does)."
        )
    shards = batch_axis_size(context_mesh())
    if pkt.shape[0] % shards or q.shape[0] % pkt.shape[0]:
        raise ValueError(
            f"splash over shared prompts: {q.shape[0]} rows of {pkt.shape[0]} prompts over "
            f"{shards} batch shards; each shard must hold whole prompts (share_prompt_blocker)."
        )
    args = (q, pkt, pv, prefix_mask, kt, v, mask)
    return _per_shard(_prompt_rows_local, args, ("q", "kv", "kv", "mask", "kv", "kv", "mask"))
