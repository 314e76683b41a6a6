"""Llama-family decoder (Llama / SmolLM2 / Qwen2 / Qwen3) in Flax NNX.

Layout: per-layer weights are stacked on a leading [L] axis and, by default
(`scan_layers=True`), the layers run under one `jax.lax.scan` (one layer
compiled, not L), optionally rematerialized per layer; with scan_layers=False,
an unstacked cache or per-layer views of the weights they run unrolled.
Kernels are stored [in, out] (the transpose of torch's Linear).

Sharding: every Param carries `out_sharding` metadata (mesh axis names from
PARAM_AXES); `sharding.create_model` places params by it. The forward is a pure
function of the param arrays (`models/forward.py`). Under a mesh with Explicit axes it runs inside
`jax.sharding.auto_axes` (GSPMD propagation) so any param/batch layout works,
and the outputs come back sharded over the batch axes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from gdpo_jax.models.config import ModelConfig
from gdpo_jax.models.forward import _constrain, forward, forward_shared_prompt
from gdpo_jax.models.kvcache import KVCache
from gdpo_jax.models.layer_weights import fuse_layer, split_layers
from gdpo_jax.sharding import BATCH_AXES, is_explicit, sanitize_spec

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
        fn = lambda *a: forward(  # noqa: E731
            *a, cfg=cfg, return_hidden=return_hidden, fresh_cache=fresh_cache
        )

        def out_sharding(mesh: jax.sharding.AbstractMesh) -> Any:
            out_dim = cfg.hidden_size if return_hidden else cfg.vocab_size
            out_spec = sanitize_spec((BATCH_AXES, None, None), (B, T, out_dim), mesh)
            if cache is None:
                return out_spec
            return (out_spec, jax.tree.map(lambda a: jax.typeof(a).sharding.spec, cache))

        return self._run(fn, args, out_sharding)

    def forward_shared_prompt(
        self,
        prompt_ids: jax.Array,
        prompt_mask: jax.Array,
        input_ids: jax.Array,
        mask: jax.Array,
        positions: jax.Array,
    ) -> jax.Array:
        """The rows' final-normed hidden f[B,T,D] over their U prompts, the
        prompts' pass and the rows' in one loop over the stacked layers
        (`forward.forward_shared_prompt`; `models.prompt_sharing` calls it).

        prompt_ids, prompt_mask {0,1}[U,P] (a fresh prefill, left padded);
        input_ids, mask {0,1}[B,T], positions i32[B,T]: the rows, prompt-major.
        """
        cfg = self.cfg
        pmask, mask = prompt_mask.astype(jnp.int32), mask.astype(jnp.int32)
        ppos = jnp.maximum(jnp.cumsum(pmask, axis=1) - 1, 0)
        args = (self.param_arrays(), prompt_ids, pmask, ppos, input_ids, mask)
        args = (*args, positions.astype(jnp.int32))
        fn = lambda *a: forward_shared_prompt(*a, cfg=cfg)  # noqa: E731
        shape = (*input_ids.shape, cfg.hidden_size)
        return self._run(
            fn, args, lambda mesh: sanitize_spec((BATCH_AXES, None, None), shape, mesh)
        )

    def _run(self, fn: Callable, args: tuple, out_sharding: Callable) -> Any:
        """fn(*args) (args[0]: the param arrays) under the mesh they live on.

        Under a mesh with Explicit axes, which would demand an out_sharding for
        every ambiguous matmul, fn runs with GSPMD propagation instead
        (`auto_axes`), its outputs laid out by `out_sharding(mesh)`.
        """
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            # No mesh in context, but params may still be typed on an Explicit
            # mesh (e.g. jit(model) outside jax.set_mesh): adopt theirs.
            mesh = jax.typeof(args[0]["embed"]).sharding.mesh
            if not mesh.empty and is_explicit(mesh):
                with jax.sharding.use_abstract_mesh(mesh):
                    return self._run(fn, args, out_sharding)
        if not mesh.empty and is_explicit(mesh):
            fn = jax.sharding.auto_axes(fn, out_sharding=out_sharding(mesh))
        return fn(*args)


def _concrete_mesh(x: Any) -> jax.sharding.Mesh | None:
    sh = (
        getattr(x, "sharding", None)
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
        else None
    )
    if isinstance(sh, jax.NamedSharding) and sh.mesh.size > 1:
        return sh.mesh
    return None
