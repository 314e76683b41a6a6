"""The decoder's forward as a pure function of its parameter arrays.

`forward` runs one stream of tokens through the L layers (training, prefill,
decode steps; `Transformer.__call__` wraps it). `forward_shared_prompt` runs a
batch's distinct prompts and their rows (`models.prompt_sharing`) through the
layers together: one loop over the layers in which each layer runs the prompts
and then the rows, which read that layer's prompt keys and values directly.
Under the layer `scan` (stacked weights) each layer's weights are then sliced
out of the stacked arrays once per forward instead of once per pass, and no
prompt cache is written and read back: on CPU, where XLA copies those slices
(docs/benchmarks.md, "The step on CPU, profiled"), the two passes paid the
copies twice.

Both run `_layer`, one decoder layer over one stream (`_Stream`: the call's
constants: its rows, masks, rotary angles and attention kernel), under
`jax.checkpoint` with `ModelConfig.remat` (`_remat`: the policy names what the
backward keeps).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from gdpo_jax.core.dense import dense
from gdpo_jax.core.logprobs import unembed_logits
from gdpo_jax.models.attention import (
    _attention,
    _attention_prefix_kernel,
    _attention_shared_prefix,
    _dpa_attention,
    attention_kind,
    attention_masks,
)
from gdpo_jax.models.config import ModelConfig
from gdpo_jax.models.kvcache import KVCache
from gdpo_jax.models.layer_weights import split_layers
from gdpo_jax.models.rope import apply_rope, rope_cos_sin
from gdpo_jax.models.splash import splash_attention
from gdpo_jax.sharding import BATCH_AXES, constrain, context_mesh, sanitize_spec

__all__ = ["forward", "forward_shared_prompt"]

# The name a weight product's output carries, which remat_policy="dots" keeps.
PRODUCT = "weight_product"


def _rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """HF RMSNorm: statistics in f32, weight applied after casting back."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return w.astype(x.dtype) * xf.astype(x.dtype)


def _constrain(x: jax.Array, axes: tuple) -> jax.Array:
    """Pins x to the legal part of `axes` when a mesh is in context (else a no-op)."""
    mesh = context_mesh()
    if mesh is None:
        return x
    return constrain(x, mesh, sanitize_spec(axes, x.shape, mesh))


def _batch_constraint(x: jax.Array) -> jax.Array:
    """Pin activations' batch dim to (data, fsdp)."""
    return _constrain(x, (BATCH_AXES,))


@dataclasses.dataclass(frozen=True)
class _Stream:
    """One call's constants for `_layer` (closed over by the layer loop, not carried).

    mask i32[B,T] (the new tokens' validity); cos, sin f32[B,T,Dh] (rotary
    angles, `rope_cos_sin`); allowed bool[B,T,S], self_attend, per_row: as
    `attention_masks` gives them; kind: the attention kernel ("xla", "splash",
    "cudnn", "dpa"); cache: the call's cache (index, read_slots and the shared
    prompt's mask / cells), or None.
    """

    mask: jax.Array
    cos: jax.Array
    sin: jax.Array
    allowed: jax.Array
    self_attend: bool
    per_row: bool
    kind: str
    cache: KVCache | None


def _stream(
    mask: jax.Array,
    positions: jax.Array,
    cache: KVCache | None,
    fresh_cache: bool,
    cfg: ModelConfig,
) -> tuple[_Stream, jax.Array]:
    """(the call's `_Stream`, its key mask bool[B,S]: the cache's mask after the write)."""
    T = mask.shape[1]
    cos, sin = rope_cos_sin(positions, cfg)
    key_mask, allowed, self_attend, per_row = attention_masks(mask, cache, fresh_cache)
    if cache is not None and cache.read_slots and not self_attend:
        allowed = allowed[..., : cache.read_slots]
    # Multi-token calls (training, prefill) may use a fused kernel; decode steps (T=1)
    # read the cache in its stored layout with the einsum path. Splash's causal
    # mask is static, so it takes self-attending calls only (not a write at a
    # traced cache index into a longer cache).
    kind = attention_kind(cfg) if T > 1 else "xla"
    if kind == "splash" and not self_attend:
        kind = "xla"
    return _Stream(mask, cos, sin, allowed, self_attend, per_row, kind, cache), key_mask


def _embed(params: dict, input_ids: jax.Array, mask: jax.Array, cfg: ModelConfig) -> jax.Array:
    """f[B,T,D] input embeddings in the compute dtype."""
    # Padded slots may hold any id (e.g. -1): map them to 0 so an out-of-range
    # gather (NaN fill) cannot leak into real rows through 0 * NaN in attention.
    ids = jnp.where(mask > 0, input_ids, 0)
    table = _constrain(params["embed"], ("tensor", None))
    return _batch_constraint(jnp.take(table, ids, axis=0).astype(jnp.dtype(cfg.dtype)))


def _layer(
    cfg: ModelConfig,
    st: _Stream,
    x: jax.Array,
    kc: jax.Array | None,
    vc: jax.Array | None,
    lp: dict[str, jax.Array],
    i: jax.Array | int,
    prefix: tuple[jax.Array, jax.Array] | None,
) -> tuple[jax.Array, jax.Array | None, jax.Array | None, jax.Array, jax.Array]:
    """One decoder layer over one stream.

    x f[B,T,D]; kc, vc: the stacked cache buffers (written at layer i, the T
    new slots) or None (nothing written); lp: the layer's weights (no [L] axis);
    prefix: this layer's shared prompt keys and values (f[U,Hkv,Dh,P],
    f[U,Hkv,P,Dh]) or None. Returns (x, kc, vc, k, v): the layer's output, the
    buffers, and the keys / values the attention read (f[B,Hkv,Dh,S],
    f[B,Hkv,S,Dh]; the T new ones when the call self-attends).
    """
    dt = jnp.dtype(cfg.dtype)
    B, T = st.mask.shape
    Hq, Hkv, Dh, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    cache = st.cache

    def proj(h, w, b=None):
        y = checkpoint_name(dense(h, w.astype(dt)), PRODUCT)  # a no-op without remat
        return y if b is None else y + b.astype(dt)

    h = _rms_norm(x, lp["attn_norm"], eps)
    if "qkv_proj" in lp:  # fused (Transformer.layer_params(fuse=True))
        qkv = proj(h, lp["qkv_proj"], lp.get("qkv_bias"))
        q, k, v = jnp.split(qkv, [Hq * Dh, (Hq + Hkv) * Dh], axis=-1)
    else:
        q = proj(h, lp["q_proj"], lp.get("q_bias"))
        k = proj(h, lp["k_proj"], lp.get("k_bias"))
        v = proj(h, lp["v_proj"], lp.get("v_bias"))
    q, k, v = q.reshape(B, T, Hq, Dh), k.reshape(B, T, Hkv, Dh), v.reshape(B, T, Hkv, Dh)
    if cfg.qk_norm:
        q, k = _rms_norm(q, lp["q_norm"], eps), _rms_norm(k, lp["k_norm"], eps)
    q, k = apply_rope(q, st.cos, st.sin), apply_rope(k, st.cos, st.sin)
    # The cache's layouts (see KVCache): k [B,Hkv,Dh,T], v [B,Hkv,T,Dh].
    k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
    if kc is not None:
        # Write only the T new slots of layer i into the carried stacked
        # cache (in place: the carry is donated loop state), then read the
        # layer's slices in their stored layouts.
        if st.per_row:  # scatter row b's token into slot index[b] (in place)
            rows = jnp.arange(B)
            kc = kc.at[i, rows, :, :, cache.index].set(k[..., 0].astype(kc.dtype))
            vc = vc.at[i, rows, :, cache.index].set(v[:, :, 0].astype(vc.dtype))
        else:
            kc = jax.lax.dynamic_update_slice(
                kc, k[None].astype(kc.dtype), (i, 0, 0, 0, cache.index)
            )
            vc = jax.lax.dynamic_update_slice(
                vc, v[None].astype(vc.dtype), (i, 0, 0, cache.index, 0)
            )
        if not st.self_attend:  # else attend to the new k, v themselves
            # The phase's prefix (KVCache.read_slots, static; the slots past
            # it are empty), sliced with the layer: one read of r slots.
            r = cache.read_slots or None
            k, v = kc[i, ..., :r], vc[i, :, :, :r]
    kind, allowed = st.kind, st.allowed
    if prefix is not None and st.self_attend and kind != "xla":  # training's own pass
        a = _attention_prefix_kernel(q, *prefix, cache.prefix_mask, k, v, st.mask, kind)
    elif prefix is not None:  # over a shared prompt (see KVCache)
        cells = dict(cell=cache.prefix_cell, group=cache.prefix_group)  # continuous.py's
        a = _attention_shared_prefix(q, *prefix, cache.prefix_mask, k, v, allowed, cfg, **cells)
    elif kind == "xla":
        a = _attention(q, k, v, allowed, cfg)
    elif kind == "splash":
        a = splash_attention(q, k, v, st.mask)
    else:
        a = _dpa_attention(q, k, v, allowed, "cudnn" if kind == "cudnn" else "xla")
    a = a.reshape(B, T, Hq * Dh)
    x = _batch_constraint(x + proj(a, lp["o_proj"]))
    h = _rms_norm(x, lp["mlp_norm"], eps)
    if "gate_up_proj" in lp:
        gate, up = jnp.split(proj(h, lp["gate_up_proj"]), 2, axis=-1)
    else:
        gate, up = proj(h, lp["gate_proj"]), proj(h, lp["up_proj"])
    f = jax.nn.silu(gate) * up
    x = _batch_constraint(x + proj(f, lp["down_proj"]))
    return x, kc, vc, k, v


def _remat(layer, cfg: ModelConfig):
    """`layer` under jax.checkpoint, keeping what `cfg.remat_policy` names: nothing
    but its inputs ("full"), or also its weight products' outputs ("dots"; named
    PRODUCT in `_layer`, which also reaches through core.dense's custom VJP)."""
    policy = None
    if cfg.remat_policy == "dots":
        policy = jax.checkpoint_policies.save_only_these_names(PRODUCT)
    return jax.checkpoint(layer, prevent_cse=False, policy=policy)


def _head(params: dict, x: jax.Array, cfg: ModelConfig, return_hidden: bool) -> jax.Array:
    """The final norm, then the logits f32[B,T,V] (or the hidden f[B,T,D])."""
    x = _rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
    if return_hidden:
        return x
    unembed = params["lm_head"] if "lm_head" in params else params["embed"].T
    return unembed_logits(x, unembed)  # shared with the sampler and the trainer


def forward(
    params: dict,
    input_ids: jax.Array,
    mask: jax.Array,
    positions: jax.Array,
    cache: KVCache | None,
    *,
    cfg: ModelConfig,
    return_hidden: bool,
    fresh_cache: bool = False,
) -> jax.Array | tuple[jax.Array, KVCache]:
    """`Transformer.__call__`'s maths (see its docstring) over the param arrays
    (`Transformer.param_arrays()`, "layers" stacked or a tuple of per-layer dicts).

    input_ids, mask i32[B,T]; positions i32[B,T] -> logits f32[B,T,V] (hidden
    f[B,T,D] when return_hidden), and the updated cache when `cache` is given.
    """
    x = _embed(params, input_ids, mask, cfg)
    st, key_mask = _stream(mask, positions, cache, fresh_cache, cfg)

    def layer(carry, xs):
        x, kc, vc = carry
        lp, i, prefix = xs  # prefix: this layer's shared prompt (pk, pv), or None
        x, kc, vc, _, _ = _layer(cfg, st, x, kc, vc, lp, i, prefix)
        return (x, kc, vc), None

    if cfg.remat:
        layer = _remat(layer, cfg)
    kc, vc = (None, None) if cache is None else (cache.k, cache.v)
    pk, pv = (None, None) if cache is None else (cache.prefix_k, cache.prefix_v)
    layers = params["layers"]
    if not cfg.scan_layers and isinstance(layers, dict):
        layers = split_layers(layers, cfg.num_layers)  # static slices, unrolled below
    if isinstance(kc, tuple) or isinstance(layers, tuple):
        # Unrolled (an unstacked cache, or weights given per layer): each layer
        # reads its own buffers. A per-layer cache enters `layer` as a [1, ...]
        # stack at index 0 (a bitcast, no copy).
        if isinstance(layers, dict):
            layers = split_layers(layers, cfg.num_layers)
        per_layer_cache = isinstance(kc, tuple)
        ks, vs = [], []
        for i, lp in enumerate(layers):
            prefix = None if pk is None else (pk[i], pv[i])
            if per_layer_cache:
                (x, ki, vi), _ = layer((x, kc[i][None], vc[i][None]), (lp, 0, prefix))
                ks.append(ki[0])
                vs.append(vi[0])
            else:
                (x, kc, vc), _ = layer((x, kc, vc), (lp, i, prefix))
        if per_layer_cache:
            kc, vc = tuple(ks), tuple(vs)
    else:
        prefix = None if pk is None else (pk, pv)
        xs = (layers, jnp.arange(cfg.num_layers), prefix)
        (x, kc, vc), _ = jax.lax.scan(layer, (x, kc, vc), xs)
    out = _head(params, x, cfg, return_hidden)
    if cache is None:
        return out
    return out, cache.replace(k=kc, v=vc, mask=key_mask, index=cache.index + input_ids.shape[1])


def forward_shared_prompt(
    params: dict,
    prompt_ids: jax.Array,
    prompt_mask: jax.Array,
    prompt_positions: jax.Array,
    input_ids: jax.Array,
    mask: jax.Array,
    positions: jax.Array,
    *,
    cfg: ModelConfig,
) -> jax.Array:
    """The rows' final-normed hidden f[B,T,D] over their prompts, both passes in
    one layer loop (module docstring).

    prompt_ids, prompt_mask, prompt_positions i32[U,P]: the U distinct prompts
    (a fresh prefill: they attend to each other causally); input_ids, mask,
    positions i32[B,T]: the B rows (prompt-major, B // U per prompt), each
    attending to its prompt's valid slots and then causally to its own. The
    same maths as a prefill of the prompts into a cache and a call of the rows
    over it as a shared prefix (`KVCache.prefix_*`), which the unrolled layers
    keep; params["layers"] stacked ([L, ...] arrays).
    """
    xp = _embed(params, prompt_ids, prompt_mask, cfg)
    xr = _embed(params, input_ids, mask, cfg)
    sp, prefix_mask = _stream(prompt_mask, prompt_positions, None, False, cfg)
    own = KVCache(
        k=None,
        v=None,
        mask=jnp.zeros(mask.shape, bool),
        index=jnp.zeros((), jnp.int32),
        prefix_mask=prefix_mask,
    )
    sr, _ = _stream(mask, positions, own, True, cfg)

    def layer(carry, lp):
        xp, xr = carry
        # The prompts' layer, then the rows' over its keys and values: no cache
        # holds them between the passes, and the layer's weights are read once.
        xp, _, _, pk, pv = _layer(cfg, sp, xp, None, None, lp, 0, None)
        xr, *_ = _layer(cfg, sr, xr, None, None, lp, 0, (pk, pv))
        return (xp, xr), None

    if cfg.remat:
        layer = _remat(layer, cfg)
    (_, xr), _ = jax.lax.scan(layer, (xp, xr), params["layers"])
    return _head(params, xr, cfg, return_hidden=True)
