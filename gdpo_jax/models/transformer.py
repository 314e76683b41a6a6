"""Llama-family decoder (Llama / SmolLM2 / Qwen2 / Qwen3) in Flax NNX.

Layout: per-layer weights are stacked on a leading [L] axis and, by default
(`scan_layers=True`), the layers run under one `jax.lax.scan` (one layer
compiled, not L), optionally rematerialized per layer; with scan_layers=False,
an unstacked cache or per-layer views of the weights they run unrolled.
Kernels are stored [in, out] (the transpose of torch's Linear).

Sharding: every Param carries `out_sharding` metadata (mesh axis names from
PARAM_AXES); `sharding.create_model` places params by it. The forward is a pure
function of the param arrays. Under a mesh with Explicit axes it runs inside
`jax.sharding.auto_axes` (GSPMD propagation) so any param/batch layout works,
and the outputs come back sharded over the batch axes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

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
from gdpo_jax.models.layer_weights import fuse_layer, split_layers
from gdpo_jax.models.rope import apply_rope, rope_cos_sin
from gdpo_jax.models.splash import splash_attention
from gdpo_jax.sharding import BATCH_AXES, constrain, context_mesh, is_explicit, sanitize_spec

# Mesh axes per param dim. Column-parallel kernels (q/k/v, gate/up, lm_head):
# input dim over "fsdp" (ZeRO-3 style gather before use), output dim over
# "tensor"; row-parallel ones (o_proj, down_proj) the other way round (Megatron);
# embedding rows over "tensor" (vocab-parallel). Dims not divisible by the
# axis size fall back to replicated (sharding.sanitize_spec).
PARAM_AXES: dict[str, tuple[str | None, ...]] = {
    "embed": ("tensor", "fsdp"),  # [V, D]
    "lm_head": ("fsdp", "tensor"),  # [D, V]
    "final_norm": (None,),  # [D]
    "attn_norm": (None, None),  # [L, D]
    "mlp_norm": (None, None),  # [L, D]
    "q_proj": (None, "fsdp", "tensor"),  # [L, D, Hq*Dh]
    "k_proj": (None, "fsdp", "tensor"),  # [L, D, Hkv*Dh]
    "v_proj": (None, "fsdp", "tensor"),  # [L, D, Hkv*Dh]
    "o_proj": (None, "tensor", "fsdp"),  # [L, Hq*Dh, D]
    "q_bias": (None, "tensor"),  # [L, Hq*Dh]
    "k_bias": (None, "tensor"),  # [L, Hkv*Dh]
    "v_bias": (None, "tensor"),  # [L, Hkv*Dh]
    "q_norm": (None, None),  # [L, Dh]
    "k_norm": (None, None),  # [L, Dh]
    "gate_proj": (None, "fsdp", "tensor"),  # [L, D, F]
    "up_proj": (None, "fsdp", "tensor"),  # [L, D, F]
    "down_proj": (None, "tensor", "fsdp"),  # [L, F, D]
}


def _param(
    rngs: nnx.Rngs | None, name: str, shape: tuple[int, ...], init: str, dtype: Any
) -> nnx.Param:
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    else:  # HF initializer_range
        value = (0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    # eager_sharding=False: placement is create_model's job (jit out_shardings),
    # so an unsharded model can be built with no mesh in context.
    return nnx.Param(value, out_sharding=PARAM_AXES[name], eager_sharding=False)


class DecoderLayers(nnx.Module):
    """All L decoder layers, each weight stacked on a leading [L] axis."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        L, D, F, Dh = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        q, kv, dt = cfg.num_heads * Dh, cfg.num_kv_heads * Dh, jnp.dtype(cfg.param_dtype)
        self.attn_norm = _param(rngs, "attn_norm", (L, D), "ones", dt)
        self.q_proj = _param(rngs, "q_proj", (L, D, q), "normal", dt)
        self.k_proj = _param(rngs, "k_proj", (L, D, kv), "normal", dt)
        self.v_proj = _param(rngs, "v_proj", (L, D, kv), "normal", dt)
        self.o_proj = _param(rngs, "o_proj", (L, q, D), "normal", dt)
        if cfg.attention_bias:
            self.q_bias = _param(rngs, "q_bias", (L, q), "zeros", dt)
            self.k_bias = _param(rngs, "k_bias", (L, kv), "zeros", dt)
            self.v_bias = _param(rngs, "v_bias", (L, kv), "zeros", dt)
        if cfg.qk_norm:
            self.q_norm = _param(rngs, "q_norm", (L, Dh), "ones", dt)
            self.k_norm = _param(rngs, "k_norm", (L, Dh), "ones", dt)
        self.mlp_norm = _param(rngs, "mlp_norm", (L, D), "ones", dt)
        self.gate_proj = _param(rngs, "gate_proj", (L, D, F), "normal", dt)
        self.up_proj = _param(rngs, "up_proj", (L, D, F), "normal", dt)
        self.down_proj = _param(rngs, "down_proj", (L, F, D), "normal", dt)


class Transformer(nnx.Module):
    """Decoder-only LM. See module docstring for layout and sharding."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = jnp.dtype(cfg.param_dtype)
        self.embed = _param(rngs, "embed", (cfg.vocab_size, cfg.hidden_size), "normal", dt)
        self.layers = DecoderLayers(cfg, rngs=rngs)
        self.final_norm = _param(rngs, "final_norm", (cfg.hidden_size,), "ones", dt)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else _param(rngs, "lm_head", (cfg.hidden_size, cfg.vocab_size), "normal", dt)
        )

    # ---------------------------------------------------------------- params
    def param_arrays(self) -> dict[str, Any]:
        """Raw arrays: {"embed", "final_norm", ["lm_head"], "layers": {name: [L,...]}}."""
        layers = {
            k: v.get_value() for k, v in vars(self.layers).items() if isinstance(v, nnx.Param)
        }
        out = {
            "embed": self.embed.get_value(),
            "final_norm": self.final_norm.get_value(),
            "layers": layers,
        }
        if self.lm_head is not None:
            out["lm_head"] = self.lm_head.get_value()
        return out

    def layer_params(self, fuse: bool = False) -> tuple[dict[str, jax.Array], ...]:
        """The L layers' weights as separate arrays ({name: array without the [L]
        axis} per layer), for ``__call__(layer_params=...)``: sliced once, outside
        a decode loop, so the loop's steps do not slice the stacked weights.

        fuse: q/k/v and gate/up concatenated per layer (`layer_weights.fuse_layer`).
        For one device: under a mesh the concatenation would mix "tensor" shards.
        """
        layers = split_layers(self.param_arrays()["layers"], self.cfg.num_layers)
        return tuple(fuse_layer(lp) for lp in layers) if fuse else layers

    def unembed_matrix(self) -> jax.Array:
        """f[D, V] output projection (embed.T when tied), in param dtype."""
        if self.lm_head is None:
            return self.embed.get_value().T
        return self.lm_head.get_value()

    # ----------------------------------------------------------------- cache
    def init_cache(self, batch: int, max_len: int, dtype: Any = None) -> KVCache:
        """Empty KVCache for `batch` rows and `max_len` slots (prompt + new tokens).

        Sharded over the batch (and kv heads over "tensor") when the params
        live on a multi-device mesh, or (inside jit, params traced) by the same
        rule under the context mesh, where zeros would otherwise be replicated.
        """
        cfg = self.cfg
        dt = jnp.dtype(dtype or cfg.dtype)
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        k_shape = shape[:3] + (cfg.head_dim, max_len)  # keys transposed (see KVCache)
        mesh = _concrete_mesh(self.embed.get_value())
        if mesh is None:
            kv_sh = mask_sh = idx_sh = None
        else:
            kv_spec = sanitize_spec((None, BATCH_AXES, "tensor", None, None), shape, mesh)
            kv_sh = jax.NamedSharding(mesh, kv_spec)
            mask_sh = jax.NamedSharding(mesh, P(kv_spec[1], None))
            idx_sh = jax.NamedSharding(mesh, P())
        cache = KVCache(
            k=jnp.zeros(k_shape, dt, device=kv_sh),
            v=jnp.zeros(shape, dt, device=kv_sh),
            mask=jnp.zeros((batch, max_len), bool, device=mask_sh),
            index=jnp.zeros((), jnp.int32, device=idx_sh),
        )
        if mesh is not None:
            return cache
        kv = (None, BATCH_AXES, "tensor", None, None)
        k, v, m = _constrain(cache.k, kv), _constrain(cache.v, kv), cache.mask
        return cache.replace(k=k, v=v, mask=_constrain(m, (BATCH_AXES, None)))

    # --------------------------------------------------------------- forward
    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        positions: jax.Array | None = None,
        cache: KVCache | None = None,
        return_hidden: bool = False,
        layer_params: tuple[dict[str, jax.Array], ...] | None = None,
        fresh_cache: bool = False,
    ) -> jax.Array | tuple[jax.Array, KVCache]:
        """input_ids i32[B,T], attention_mask {0,1}[B,T] (left padding allowed).

        Returns logits f32[B,T,V] (or final-normed hidden f[B,T,D] when
        return_hidden), plus the updated cache when `cache` is given. With a
        cache the T tokens go to slots [cache.index, cache.index+T) and attend
        to earlier valid slots; positions default to the count of valid tokens
        before each one (so left padding and decode steps line up).

        An unstacked cache (``KVCache.unstacked``) runs the layers unrolled (see
        KVCache); `layer_params` (from ``layer_params()``) then replaces the
        stacked weights, so a decode loop slices them once, not every step.

        `fresh_cache`: the caller's promise that `cache` holds nothing yet (a
        prefill at index 0, as from ``init_cache``). The T tokens then attend to
        each other directly, not through the cache's S >= T slots: the same
        result, over [T, T] instead of [T, S] scores, and the multi-token kernels
        (splash included) apply as in a cache-free call. The cache is written
        as usual.
        """
        cfg = self.cfg
        B, T = input_ids.shape
        mask = (
            jnp.ones((B, T), jnp.int32)
            if attention_mask is None
            else attention_mask.astype(jnp.int32)
        )
        if positions is None:
            positions = jnp.cumsum(mask, axis=1) - 1
            if cache is not None:
                before = jnp.arange(cache.mask.shape[1])[None, :] < cache.index.reshape(-1, 1)
                positions = positions + jnp.sum(cache.mask & before, axis=1, keepdims=True)
            positions = jnp.maximum(positions, 0)
        params = self.param_arrays()
        if layer_params is not None:
            params["layers"] = tuple(layer_params)
        args = (params, input_ids, mask, positions.astype(jnp.int32), cache)
        fn = lambda *a: _forward(  # noqa: E731
            *a, cfg=cfg, return_hidden=return_hidden, fresh_cache=fresh_cache
        )
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            # No mesh in context, but params may still be typed on an Explicit
            # mesh (e.g. jit(model) outside jax.set_mesh): adopt theirs.
            mesh = jax.typeof(args[0]["embed"]).sharding.mesh
            if not mesh.empty and is_explicit(mesh):
                with jax.sharding.use_abstract_mesh(mesh):
                    return self(
                        input_ids,
                        mask,  # made here: a default built under the abstract mesh failed
                        positions=positions,
                        cache=cache,
                        return_hidden=return_hidden,
                        layer_params=layer_params,
                        fresh_cache=fresh_cache,
                    )
        if not mesh.empty and is_explicit(mesh):
            # Explicit axes would demand an out_sharding for every ambiguous
            # matmul; run the model with GSPMD propagation instead.
            out_dim = cfg.hidden_size if return_hidden else cfg.vocab_size
            out_spec = sanitize_spec((BATCH_AXES, None, None), (B, T, out_dim), mesh)
            out_sh: Any = out_spec
            if cache is not None:
                out_sh = (out_spec, jax.tree.map(lambda a: jax.typeof(a).sharding.spec, cache))
            fn = jax.sharding.auto_axes(fn, out_sharding=out_sh)
        out = fn(*args)
        return out


def _concrete_mesh(x: Any) -> jax.sharding.Mesh | None:
    sh = (
        getattr(x, "sharding", None)
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
        else None
    )
    if isinstance(sh, jax.NamedSharding) and sh.mesh.size > 1:
        return sh.mesh
    return None


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


def _forward(
    params: dict,
    input_ids: jax.Array,
    mask: jax.Array,
    positions: jax.Array,
    cache: KVCache | None,
    *,
    cfg: ModelConfig,
    return_hidden: bool,
    fresh_cache: bool = False,
):
    dt = jnp.dtype(cfg.dtype)
    B, T = input_ids.shape
    Hq, Hkv, Dh, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    # Padded slots may hold any id (e.g. -1): map them to 0 so an out-of-range
    # gather (NaN fill) cannot leak into real rows through 0 * NaN in attention.
    ids = jnp.where(mask > 0, input_ids, 0)
    x = _batch_constraint(
        jnp.take(_constrain(params["embed"], ("tensor", None)), ids, axis=0).astype(dt)
    )
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

    def proj(h, w, b=None):
        y = dense(h, w.astype(dt))
        return y if b is None else y + b.astype(dt)

    def layer(carry, xs):
        x, kc, vc = carry
        lp, i, prefix = xs  # prefix: this layer's shared prompt (pk, pv), or None
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
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # The cache's layouts (see KVCache): k [B,Hkv,Dh,T], v [B,Hkv,T,Dh].
        k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
        if kc is not None:
            # Write only the T new slots of layer i into the carried stacked
            # cache (in place: the carry is donated loop state), then read the
            # layer's slices in their stored layouts.
            if per_row:  # scatter row b's token into slot index[b] (in place)
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
            if not self_attend:  # else attend to the new k, v themselves
                # The phase's prefix (KVCache.read_slots, static; the slots past
                # it are empty), sliced with the layer: one read of r slots.
                r = cache.read_slots or None
                k, v = kc[i, ..., :r], vc[i, :, :, :r]
        if prefix is not None and self_attend and kind != "xla":  # training's own pass
            a = _attention_prefix_kernel(q, *prefix, cache.prefix_mask, k, v, mask, kind)
        elif prefix is not None:  # over a shared prompt (see KVCache)
            cells = dict(cell=cache.prefix_cell, group=cache.prefix_group)  # continuous.py's
            a = _attention_shared_prefix(q, *prefix, cache.prefix_mask, k, v, allowed, cfg, **cells)
        elif kind == "xla":
            a = _attention(q, k, v, allowed, cfg)
        elif kind == "splash":
            a = splash_attention(q, k, v, mask)
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
        return (x, kc, vc), None

    if cfg.remat:
        layer = jax.checkpoint(layer, prevent_cse=False)
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
    x = _rms_norm(x, params["final_norm"], eps)
    if return_hidden:
        out = x
    else:
        unembed = params["lm_head"] if "lm_head" in params else params["embed"].T
        out = unembed_logits(x, unembed)  # shared with the sampler and the trainer
    if cache is None:
        return out
    return out, cache.replace(k=kc, v=vc, mask=key_mask, index=cache.index + T)
