"""Core model tests: config, RoPE vs transformers, KV cache, remat, dtypes, sharding."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gdpo_jax.models import KVCache, ModelConfig, Transformer, create_model, get_param_specs
from gdpo_jax.models.rope import rope_frequencies
from gdpo_jax.models.sharding import abstract_model, sanitize_spec

QWEN3ISH = dict(model_type="qwen3", qk_norm=True, tie_word_embeddings=True, head_dim=24)
QWEN2ISH = dict(model_type="qwen2", attention_bias=True)


def _batch(B=4, T=8, V=256, seed=0):
    rs = np.random.RandomState(seed)
    ids = rs.randint(3, V, (B, T)).astype(np.int32)
    lens = np.array([T, T - 3, 1, T - 1][:B])
    mask = (np.arange(T)[None, :] >= T - lens[:, None]).astype(np.int32)  # left padded
    return jnp.asarray(ids), jnp.asarray(mask)


def _random_model(cfg: ModelConfig, seed: int = 1) -> Transformer:
    """Unsharded model with random weights, norms and biases (so a mishandled
    one shows in the logits), filled from NumPy: no init compile."""
    rs = np.random.RandomState(seed)
    graphdef, state = nnx.split(abstract_model(cfg))
    flat = []
    for path, var in nnx.to_flat_state(state):
        v = var.get_value()
        name = str(path[-1])
        scale = 0.3 if ("norm" in name or "bias" in name) else 0.1
        base = 1.0 if "norm" in name else 0.0
        flat.append((path, var.replace(jnp.asarray(base + scale * rs.randn(*v.shape), v.dtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


_fwd = jax.jit(lambda m, i, k: m(i, k))


@pytest.fixture(scope="module")
def models():
    out = {}
    for name, kw in [("llama", {}), ("qwen2", QWEN2ISH), ("qwen3", QWEN3ISH)]:
        out[name] = _random_model(ModelConfig.tiny(**kw))
    return out


# ----------------------------------------------------------------- config
def test_config_hf_roundtrip_and_hashable():
    cfg = ModelConfig.tiny(
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        eos_token_id=[2, 5],
    )
    hash(cfg)
    back = ModelConfig.from_hf(cfg.to_hf())
    assert back == cfg
    # transformers<5 spelling: rope_theta + rope_scaling with legacy "type".
    legacy = {k: v for k, v in cfg.to_hf().items() if k != "rope_parameters"}
    legacy["rope_scaling"] = {"type": "linear", "factor": 2.0}
    assert ModelConfig.from_hf(legacy).rope_scaling_dict() == {"rope_type": "linear", "factor": 2.0}
    # Both spellings: the same settings load; disagreeing ones are refused (the two were
    # merged, and a legacy "type" lost to rope_parameters' "default": plain RoPE at the
    # wrong theta, where transformers takes rope_scaling alone).
    both = {**legacy, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}
    assert ModelConfig.from_hf(both).rope_scaling_dict() == {"rope_type": "linear", "factor": 2.0}
    for params in (
        {"rope_type": "default", "rope_theta": 5e5},
        {"rope_type": "linear", "factor": 4.0},
    ):
        with pytest.raises(ValueError, match="rope_scaling=.* disagrees with it; keep one"):
            ModelConfig.from_hf({**legacy, "rope_parameters": params})


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="gpt2.*supported"):
        ModelConfig.from_hf({**ModelConfig.tiny().to_hf(), "model_type": "gpt2"})
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelConfig.tiny(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="dynamic"):
        ModelConfig.tiny(rope_scaling={"rope_type": "dynamic", "factor": 2.0})


ARCH = {"llama": (False, False), "qwen2": (True, False), "qwen3": (False, True)}


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_architecture_flags_follow_model_type(model_type):
    # (attention_bias, qk_norm) of transformers' Llama / Qwen2 / Qwen3 attention;
    # tiny(model_type="qwen3") had no q/k norm (reachable as --config.model.tiny.model_type).
    for cfg in (ModelConfig.tiny(model_type=model_type), ModelConfig(model_type=model_type)):
        assert (cfg.attention_bias, cfg.qk_norm) == ARCH[model_type]
        assert ModelConfig.from_hf(cfg.to_hf()) == cfg


@pytest.mark.parametrize(
    "kw",
    [
        dict(attention_bias=True),
        dict(qk_norm=True),
        dict(model_type="qwen3", qk_norm=False),
        dict(model_type="qwen3", attention_bias=True),
        dict(model_type="qwen2", attention_bias=False),
        dict(model_type="qwen2", qk_norm=True),
    ],
    ids=str,
)
def test_flags_no_hf_class_has_are_refused_at_export(kw, tmp_path):
    from gdpo_jax.models import save_pretrained

    cfg = ModelConfig.tiny(**kw)  # builds and runs: tests mix features on one model
    with pytest.raises(ValueError, match=r"attention_bias=.*qk_norm=.*no Hugging Face equivalent"):
        cfg.to_hf()
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"no Hugging Face equivalent"):
        save_pretrained(_random_model(cfg), None, str(out))
    assert not out.exists()


_LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    "rope,missing",
    [
        ({"rope_type": "llama3", "factor": 8.0}, "low_freq_factor"),
        ({k: v for k, v in _LLAMA3.items() if k != "high_freq_factor"}, "high_freq_factor"),
        ({"rope_type": "linear"}, "factor"),
        ({"rope_type": "yarn", "original_max_position_embeddings": 64}, "factor"),
    ],
)
def test_rope_scaling_without_its_keys_is_refused_as_transformers_does(rope, missing):
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    with pytest.raises(ValueError, match=rf"rope_type='{rope['rope_type']}' needs \[.*'{missing}'"):
        ModelConfig.tiny(rope_scaling=rope)
    hf = {**ModelConfig.tiny().to_hf(), "rope_parameters": None, "rope_scaling": rope}
    with pytest.raises(ValueError, match=missing):  # config.json: at load, not in a trace
        ModelConfig.from_hf(hf)
    with pytest.raises(KeyError, match=missing):  # transformers refuses the same dict
        hf_cfg = LlamaConfig(**{k: v for k, v in hf.items() if k != "rope_parameters"})
        ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_cfg, torch.device("cpu"))


def test_top_level_original_max_position_embeddings_wins_as_in_transformers():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = {
        **ModelConfig.tiny(max_position_embeddings=256).to_hf(),
        "rope_parameters": None,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "original_max_position_embeddings": 16,  # Phi3-style, outside the rope dict
    }
    cfg = ModelConfig.from_hf(hf)
    assert cfg.rope_scaling_dict()["original_max_position_embeddings"] == 16
    ref, ref_scale = ROPE_INIT_FUNCTIONS["yarn"](
        LlamaConfig(**{k: v for k, v in hf.items() if k != "rope_parameters"}), torch.device("cpu")
    )
    ours, scale = rope_frequencies(cfg)
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-6)
    assert scale == pytest.approx(ref_scale)


def test_the_legacy_type_key_is_read_however_the_config_is_built():
    """{"type": "linear"} (transformers' legacy key) was read by from_hf only: a config
    built directly (ModelConfig.tiny, from_hf's rope_scaling override) ran plain RoPE,
    and an unsupported type passed its check."""
    legacy = ModelConfig.tiny(rope_scaling={"type": "linear", "factor": 4.0})
    modern = ModelConfig.tiny(rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert legacy.rope_scaling_dict() == {"rope_type": "linear", "factor": 4.0}
    np.testing.assert_array_equal(rope_frequencies(legacy)[0], rope_frequencies(modern)[0])
    plain = rope_frequencies(ModelConfig.tiny())[0]
    np.testing.assert_allclose(rope_frequencies(legacy)[0], plain / 4.0, rtol=1e-6)
    with pytest.raises(ValueError, match="dynamic"):
        ModelConfig.tiny(rope_scaling={"type": "dynamic", "factor": 4.0})
    with pytest.raises(ValueError, match="low_freq_factor"):
        ModelConfig.tiny(rope_scaling={"type": "llama3", "factor": 8.0})


@pytest.mark.parametrize(
    "edit,match",
    [
        ({"factor": "8"}, "factor='8'.*number > 0"),
        ({"high_freq_factor": 1.0}, "high_freq_factor=1.0 must exceed low_freq_factor=1.0"),
    ],
)
def test_rope_scaling_bad_values_are_refused(edit, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.tiny(rope_scaling={**_LLAMA3, **edit})


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        # transformers fills a missing original_max_position_embeddings with
        # max_position_embeddings (here 256, so the factor alone scales).
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
        {"rope_type": "yarn", "factor": 4.0},
    ],
)
@pytest.mark.parametrize("head_dim", [16, 24, 128])
def test_rope_frequencies_match_transformers(rope, head_dim):
    """Within one f32 step of transformers' frequencies (its float32 pow's own error;
    3 for llama3); the exponents computed in f64 put a head_dim of 24 four steps off,
    which moved cos by 9e-3 at position 131071."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = ModelConfig.tiny(
        rope_theta=500000.0, rope_scaling=rope, max_position_embeddings=256, head_dim=head_dim
    )
    hf = LlamaConfig(
        **{k: v for k, v in cfg.to_hf().items() if k not in ("rope_scaling", "rope_theta")}
    )
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    default = LlamaRotaryEmbedding.compute_default_rope_parameters
    for kind in (rope["rope_type"], "default"):
        init = ROPE_INIT_FUNCTIONS[kind] if kind != "default" else default
        ref, ref_scale = init(hf, device=torch.device("cpu"))
        ours, scale = rope_frequencies(
            cfg if kind != "default" else dataclasses.replace(cfg, rope_scaling=None)
        )
        ref = ref.numpy().astype(np.float32)
        assert ours.dtype == ref.dtype == np.float32 and ours.shape == ref.shape
        steps = np.abs(ours.view(np.int32).astype(np.int64) - ref.view(np.int32))
        # llama3's smoothing subtracts near-equal numbers: one step of transformers'
        # own f32 pow error becomes up to 3 there.
        assert steps.max() <= (3 if kind == "llama3" else 1), (kind, steps.max())
        assert scale == pytest.approx(ref_scale)
    plain, _ = rope_frequencies(dataclasses.replace(cfg, rope_scaling=None))
    scaled, _ = rope_frequencies(cfg)
    assert np.abs(plain - scaled).max() > 1e-3  # the scaling really changed something


# ----------------------------------------------------------------- forward / cache
@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_kv_cache_decode_matches_full_forward(models, name):
    model = models[name]
    ids, mask = _batch()
    full = _fwd(model, ids, mask)
    assert full.dtype == jnp.float32 and full.shape == (4, 8, 256)
    step = jax.jit(lambda m, x, k, c: m(x, k, cache=c))
    cache = model.init_cache(4, 12)
    outs = []
    logits, cache = step(model, ids[:, :3], mask[:, :3], cache)  # prefill 3
    outs.append(logits)
    logits, cache = step(model, ids[:, 3:5], mask[:, 3:5], cache)  # a 2-token chunk
    outs.append(logits)
    for t in range(5, 8):  # then token by token
        logits, cache = step(model, ids[:, t : t + 1], mask[:, t : t + 1], cache)
        outs.append(logits)
    got = jnp.concatenate(outs, axis=1)
    valid = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(full)[valid], atol=2e-5)
    assert int(cache.index) == 8 and isinstance(cache, KVCache)
    np.testing.assert_array_equal(np.asarray(cache.mask[:, :8]), valid)
    assert not np.asarray(cache.mask[:, 8:]).any()


@pytest.mark.parametrize("T,cell", [(1, None), (2, None), (1, (5, 0, 9, 2, 3))])
def test_shared_prefix_attention_matches_numpy(T, cell):
    """_attention_shared_prefix against a NumPy reference: each row's prompt
    slots copied in front of its own, one masked softmax (GQA: query head h
    reads kv head h // G); left-padded prompts, a partly filled own cache.
    cell: continuous batching's lanes in a [U, R] grid of prompt slots (lane b
    reads slot cell[b] // R; two lanes share slot 1, cells 1 and 4 are empty,
    lane 2 (cell 9 >= U * R) is idle: its output is not compared)."""
    from gdpo_jax.models.attention import _attention_shared_prefix

    cfg = ModelConfig.tiny()
    Hq, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    U, R, P, S = 3, 2, 5, 4
    B = U * R if cell is None else len(cell)
    slot_of = np.arange(B) // R if cell is None else np.asarray(cell) // R
    rs = np.random.RandomState(0)
    q = rs.randn(B, T, Hq, Dh).astype(np.float32)
    pk, pv = (rs.randn(U, Hkv, P, Dh).astype(np.float32) for _ in range(2))
    k, v = (rs.randn(B, Hkv, S, Dh).astype(np.float32) for _ in range(2))
    prefix_mask = np.arange(P)[None] >= np.array([0, 2, 4])[:, None]  # left padding
    allowed = np.zeros((B, T, S), bool)
    for t in range(T):
        allowed[:, t, : 1 + t] = True  # own slots up to the query's
    out = _attention_shared_prefix(
        jnp.asarray(q),
        jnp.asarray(pk.transpose(0, 1, 3, 2)),
        jnp.asarray(pv),
        jnp.asarray(prefix_mask),
        jnp.asarray(k.transpose(0, 1, 3, 2)),
        jnp.asarray(v),
        jnp.asarray(allowed),
        cfg,
        **({} if cell is None else dict(cell=jnp.asarray(cell, jnp.int32), group=R)),
    )
    ref = np.zeros_like(q)
    for b in range(B):
        u = slot_of[b]
        if u >= U:  # an idle lane
            continue
        for h in range(Hq):
            kv = h // (Hq // Hkv)
            keys = np.concatenate([pk[u, kv], k[b, kv]])  # [P+S, Dh]
            vals = np.concatenate([pv[u, kv], v[b, kv]])
            for t in range(T):
                ok = np.concatenate([prefix_mask[u], allowed[b, t]])
                s = keys @ q[b, t, h] / np.sqrt(Dh)
                w = np.where(ok, np.exp(s - s[ok].max()), 0.0)
                ref[b, t, h] = (w / w.sum()) @ vals
    live = slot_of < U
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(np.asarray(out)[live], ref[live], atol=2e-5)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_shared_prompt_cache_equals_per_row_copies(models, name):
    """Decode steps over a prompt cache shared by its rows (KVCache.prefix_*,
    stacked under the scan and unstacked) give the logits of the cache with
    each row's copy of its prompt."""
    model = models[name]
    ids, mask = _batch(B=2, T=6)
    R, P = 3, 4
    step = jax.jit(lambda m, x, k, c, pos: m(x, k, positions=pos, cache=c))
    _, prompts = step(model, ids[:, :P], mask[:, :P], model.init_cache(2, P), None)
    rows_of = np.repeat(np.arange(2), R)
    # Per-row copies: the prompt slots gathered to rows, 3 more empty slots.
    copied = KVCache(
        k=jnp.pad(prompts.k[:, rows_of], [(0, 0)] * 4 + [(0, 3)]),
        v=jnp.pad(prompts.v[:, rows_of], [(0, 0)] * 3 + [(0, 3), (0, 0)]),
        mask=jnp.pad(prompts.mask[rows_of], [(0, 0), (0, 3)]),
        index=jnp.asarray(P, jnp.int32),
    )
    own = model.init_cache(2 * R, 3)
    shared = own.replace(prefix_k=prompts.k, prefix_v=prompts.v, prefix_mask=prompts.mask)
    pos0 = jnp.sum(mask[:, :P], axis=1)[rows_of, None]
    tok = jnp.asarray(np.random.RandomState(1).randint(3, 200, (2 * R, 3)), jnp.int32)
    one = jnp.ones((2 * R, 1), jnp.int32)
    refs = []
    for t in range(3):
        logits, copied = step(model, tok[:, t : t + 1], one, copied, pos0 + t)
        refs.append(np.asarray(logits))
    for c in (shared, shared.unstacked()):
        assert c.prefix_k is not None and (c.is_stacked == (c is shared))
        for t in range(3):
            logits, c = step(model, tok[:, t : t + 1], one, c, pos0 + t)
            np.testing.assert_allclose(np.asarray(logits), refs[t], atol=2e-5)
        assert int(c.index) == 3 and np.asarray(c.mask).all()


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_unstacked_cache_and_layer_params_equal_the_scan(models, name):
    """Decode's unrolled forms (per-layer cache buffers, weights sliced once,
    q/k/v and gate/up fused) give the stacked scan's logits and cache; the
    qwen2 model covers the fused biases, qwen3 the q/k norms."""
    model = models[name]
    ids, mask = _batch()
    step = jax.jit(lambda m, x, k, c, lp: m(x, k, cache=c, layer_params=lp))
    _, cache = step(model, ids[:, :5], mask[:, :5], model.init_cache(4, 8), None)
    per_layer = cache.unstacked()
    assert not per_layer.is_stacked and len(per_layer.k) == model.cfg.num_layers
    for i, (k, v) in enumerate(zip(per_layer.k, per_layer.v)):
        np.testing.assert_array_equal(np.asarray(k), np.asarray(cache.k[i]))
        np.testing.assert_array_equal(np.asarray(v), np.asarray(cache.v[i]))
    assert per_layer.unstacked() is per_layer
    fused = model.layer_params(fuse=True)
    assert "qkv_proj" in fused[0] and "q_proj" not in fused[0] and "gate_up_proj" in fused[0]
    assert ("qkv_bias" in fused[0]) == model.cfg.attention_bias
    np.testing.assert_array_equal(
        np.asarray(fused[1]["qkv_proj"][:, -model.cfg.num_kv_heads * model.cfg.head_dim :]),
        np.asarray(model.layers.v_proj.get_value()[1]),
    )
    variants = {
        "stacked cache, per-layer weights": (cache, model.layer_params()),
        "unstacked cache": (per_layer, None),
        "unstacked cache, per-layer weights": (per_layer, model.layer_params()),
        "unstacked cache, fused weights": (per_layer, fused),
    }
    ref_cache, refs = cache, []
    for t in range(5, 8):  # the scan: reference
        logits, ref_cache = step(model, ids[:, t : t + 1], mask[:, t : t + 1], ref_cache, None)
        refs.append(np.asarray(logits))
    for label, (c, lp) in variants.items():
        for j, t in enumerate(range(5, 8)):
            logits, c = step(model, ids[:, t : t + 1], mask[:, t : t + 1], c, lp)
            np.testing.assert_allclose(np.asarray(logits), refs[j], atol=2e-5, err_msg=label)
        assert c.is_stacked == label.startswith("stacked")
        k = c.k if c.is_stacked else jnp.stack(c.k)
        np.testing.assert_allclose(np.asarray(k), np.asarray(ref_cache.k), atol=2e-5)
        np.testing.assert_array_equal(np.asarray(c.mask), np.asarray(ref_cache.mask))


def test_unrolled_decode_step_evaluates_rope_once(models):
    """The RoPE cos/sin of a forward are computed once, not once per consumer: with
    the layers unrolled (the sampler's decode) XLA:CPU fused them into 3 fusions per
    layer, each evaluating cos and sin again."""
    import re

    model = models["llama"]
    ids, mask = _batch()
    cache = model.init_cache(4, 8).unstacked()
    step = jax.jit(lambda m, x, k, c, lp: m(x, k, cache=c, layer_params=lp))
    hlo = step.lower(model, ids[:, :1], mask[:, :1], cache, model.layer_params(fuse=True))
    text = hlo.compile().as_text()
    assert model.cfg.num_layers > 1
    assert len(re.findall(r"= f32\[[0-9,]*\]\S* cosine\(", text)) == 1
    assert len(re.findall(r"= f32\[[0-9,]*\]\S* sine\(", text)) == 1


def test_left_padding_equals_unpadded(models):
    """A left-padded row gives the same logits as the same tokens unpadded."""
    model = models["llama"]
    ids, mask = _batch()
    full = np.asarray(_fwd(model, ids, mask))
    # Whatever id sits in a padded slot (even out of range) changes nothing.
    junk = np.asarray(_fwd(model, jnp.where(mask > 0, ids, -1), mask))
    np.testing.assert_array_equal(junk[np.asarray(mask, bool)], full[np.asarray(mask, bool)])
    for r in (1, 3):
        n = int(mask[r].sum())
        alone = np.asarray(_fwd(model, ids[r : r + 1, -n:], None))
        np.testing.assert_allclose(full[r, -n:], alone[0], atol=2e-5)


def test_return_hidden_and_unembed(models):
    for name in ("llama", "qwen3"):  # untied and tied
        model = models[name]
        ids, mask = _batch()
        h = jax.jit(lambda m, ids=ids, mask=mask: m(ids, mask, return_hidden=True))(model)
        assert h.shape == (4, 8, model.cfg.hidden_size)
        np.testing.assert_allclose(
            np.asarray(h @ model.unembed_matrix()), np.asarray(_fwd(model, ids, mask)), atol=2e-5
        )


def test_remat_same_grads():
    cfg = ModelConfig.tiny()
    ids, mask = _batch()

    loss = lambda m: jnp.sum(m(ids, mask) ** 2 * mask[..., None])  # noqa: E731

    def grads(remat):
        model = _random_model(dataclasses.replace(cfg, remat=remat))
        jaxpr = str(
            jax.make_jaxpr(lambda s: loss(nnx.merge(nnx.graphdef(model), s)))(nnx.state(model))
        )
        assert ("remat" in jaxpr or "checkpoint" in jaxpr) == remat
        return jax.tree.leaves(jax.jit(nnx.grad(loss))(model))

    for a, b in zip(grads(False), grads(True)):
        a, b = np.asarray(a), np.asarray(b)  # f32 summation order differs: relative check
        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max() + 1e-7


@pytest.mark.parametrize("remat", [False, True])
def test_unrolled_layers_equal_the_scan(remat):
    """ModelConfig.scan_layers=False (a Python loop over the layers) gives the
    scan's logits, gradients and prefilled KV cache; the jaxpr has no scan."""
    cfg = ModelConfig.tiny(num_layers=3, remat=remat)
    ids, mask = _batch()
    loss = lambda m: jnp.sum(m(ids, mask) ** 2 * mask[..., None])  # noqa: E731
    out = {}
    for scan in (True, False):
        model = _random_model(dataclasses.replace(cfg, scan_layers=scan))
        jaxpr = str(jax.make_jaxpr(lambda m: m(ids, mask))(model))
        assert ("scan[" in jaxpr) == scan
        logits = jax.jit(lambda m: m(ids, mask))(model)
        grads = jax.tree.leaves(jax.jit(nnx.grad(loss))(model))
        _, cache = jax.jit(lambda m: m(ids, mask, cache=m.init_cache(4, 10)))(model)
        out[scan] = (logits, grads, cache)
    np.testing.assert_allclose(out[False][0], out[True][0], atol=1e-5, rtol=0)
    for a, b in zip(out[False][1], out[True][1]):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and np.abs(a - b).max() <= 1e-5 * np.abs(b).max() + 1e-7
    for a, b in zip(jax.tree.leaves(out[False][2]), jax.tree.leaves(out[True][2])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0)


def test_unrolled_layers_gradient_is_one_concatenate_not_a_pad_per_layer():
    """Unrolled, the stacked [L, ...] weights are split once: autodiff stacks
    the L layer gradients with one concatenate per weight. Indexing v[i] per
    layer transposed into L zero-padded [L, ...] gradients summed together
    (O(L^2) traffic: the largest non-matmul cost of a 30-layer fwd+bwd)."""
    cfg = ModelConfig.tiny(num_layers=3, scan_layers=False)
    ids, mask = _batch()
    model = _random_model(cfg)
    loss = lambda m: jnp.sum(m(ids, mask) ** 2 * mask[..., None])  # noqa: E731
    jaxpr = str(jax.make_jaxpr(nnx.grad(loss))(model))
    stacked = model.param_arrays()["layers"]
    shapes = {f"f32[{','.join(map(str, v.shape))}]" for v in stacked.values()}
    pads = re.findall(r"(f32\[[\d,]*\]) = pad\[", jaxpr)
    assert not shapes & set(pads)  # no weight-shaped pad (RoPE's pads are activations')
    concats = set(re.findall(r"(f32\[[\d,]*\]) = concatenate\[", jaxpr))
    assert shapes <= concats  # each stacked weight's gradient: one concatenate


def test_bf16_params_and_compute(models):
    ref = models["llama"]
    cfg = dataclasses.replace(ref.cfg, param_dtype="bfloat16", dtype="bfloat16")
    model = _random_model(cfg)
    nnx.update(model, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(ref)))
    assert model.layers.q_proj.get_value().dtype == jnp.bfloat16
    ids, mask = _batch()
    out = _fwd(model, ids, mask)
    assert out.dtype == jnp.float32
    valid = np.asarray(mask, bool)
    want = np.asarray(_fwd(ref, ids, mask))
    err = np.abs(np.asarray(out) - want)[valid]
    # bf16 rounding costs about 1.4 % of the largest logit here; a bf16-only bug in a
    # norm or a mask costs more than the 5 % allowed (it allowed 15 %).
    assert err.max() < 0.05 * np.abs(want).max()
    cache = model.init_cache(4, 8)
    assert cache.k.dtype == jnp.bfloat16


# ----------------------------------------------------------------- sharding
def test_sanitize_spec():
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    assert sanitize_spec((("data", "fsdp"), None), (8, 3), mesh) == jax.P(("data", "fsdp"), None)
    assert sanitize_spec((("data", "fsdp"), None), (2, 3), mesh) == jax.P("data", None)
    assert sanitize_spec(("tensor", "fsdp"), (3, 4), mesh) == jax.P(None, "fsdp")
    assert sanitize_spec(("fsdp", "fsdp"), (4, 4), mesh) == jax.P("fsdp", None)
    small = jax.make_mesh((8,), ("data",))
    assert sanitize_spec((None, "fsdp", "tensor"), (2, 8, 8), small) == jax.P(None, None, None)


@pytest.mark.parametrize("shape,full", [((2, 2, 2), True), ((1, 2, 4), False)])
def test_sharded_equals_unsharded(models, shape, full):
    axes = ("data", "fsdp", "tensor")
    ref = models["qwen2"]
    # Explicit axes (jax.make_mesh's default) and Auto (GSPMD) axes both work.
    kind = jax.sharding.AxisType.Explicit if full else jax.sharding.AxisType.Auto
    mesh = jax.make_mesh(shape, axes, axis_types=(kind,) * 3)
    model = create_model(ref.cfg, mesh=mesh)
    # Copy the reference weights into the born-sharded model, keeping shardings.
    nnx.update(
        model,
        jax.tree.map(lambda r, m: jax.device_put(r, m.sharding), nnx.state(ref), nnx.state(model)),
    )
    sizes = dict(zip(axes, shape))
    for path, var in nnx.to_flat_state(nnx.state(model)):
        arr = var.get_value()
        spec = arr.sharding.spec
        assert spec == get_param_specs(model, mesh)["/".join(map(str, path))]
        # The shard shape proves the array really is split as declared.
        expect = list(arr.shape)
        for d, entry in enumerate(spec):
            for a in (entry,) if isinstance(entry, str) else entry or ():
                expect[d] //= sizes[a]
        assert arr.addressable_shards[0].data.shape == tuple(expect), path
    assert get_param_specs(model, mesh)["layers/q_proj"] == sanitize_spec(
        (None, "fsdp", "tensor"), model.layers.q_proj.get_value().shape, mesh
    )
    ids, mask = _batch()
    want = np.asarray(_fwd(ref, ids, mask))
    with jax.set_mesh(mesh):
        batch_sh = jax.NamedSharding(mesh, sanitize_spec((("data", "fsdp"),), (4, 8), mesh))
        sids, smask = jax.device_put(ids, batch_sh), jax.device_put(mask, batch_sh)
        got = jax.jit(lambda m, i, k: m(i, k))(model, sids, smask)
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)
        if not full:
            return
        # Cached decode and gradients also run sharded.
        cache = model.init_cache(4, 10)
        assert cache.k.sharding.mesh == mesh
        lg, cache = jax.jit(lambda m, i, k, c: m(i, k, cache=c))(model, sids, smask, cache)
        valid = np.asarray(mask, bool)  # padded query rows are garbage by contract
        np.testing.assert_allclose(np.asarray(lg)[valid], want[valid], atol=2e-5)
        g = jax.jit(nnx.grad(lambda m: jnp.sum(m(sids, smask) ** 2)))(model)
        assert (
            g.layers.q_proj.get_value().sharding.spec
            == model.layers.q_proj.get_value().sharding.spec
        )
    # Without a mesh in context the explicit-sharded params still work.
    np.testing.assert_allclose(np.asarray(jax.jit(lambda m: m(ids, mask))(model)), want, atol=2e-5)
    if full:
        # And eagerly without a mask (docs/models.md's decode step): its default mask was
        # built under the params' abstract mesh, which JAX refused.
        full_ids = ids[mask.astype(bool).all(axis=1)]
        got = np.asarray(model(full_ids))
        np.testing.assert_allclose(got, want[mask.astype(bool).all(axis=1)], atol=2e-5)
        assert full_ids.shape[0] > 0


def test_create_model_unsharded_init():
    cfg = ModelConfig.tiny(param_dtype="bfloat16")
    model = create_model(cfg, seed=0)
    q = np.asarray(model.layers.q_proj.get_value(), np.float32)
    assert model.layers.q_proj.get_value().dtype == jnp.bfloat16 and q.shape == (2, 64, 64)
    assert 0.015 < q.std() < 0.025  # HF initializer_range
    np.testing.assert_array_equal(np.asarray(model.final_norm.get_value(), np.float32), 1.0)
    assert cfg.num_params() == sum(x.size for x in jax.tree.leaves(nnx.state(model)))


# ------------------------------------------------------- attention kernels
def test_attention_kind_by_backend_and_config():
    from gdpo_jax.models.attention import attention_kind

    f32, bf16 = ModelConfig.tiny(), ModelConfig.tiny(dtype="bfloat16")
    assert attention_kind(f32, "cpu") == "xla" and attention_kind(bf16, "tpu") == "splash"
    assert attention_kind(bf16, "gpu") == "cudnn" and attention_kind(f32, "gpu") == "xla"
    assert attention_kind(dataclasses.replace(f32, attention="dpa"), "cpu") == "dpa"
    with pytest.raises(ValueError, match="model.attention='cudnn' needs a GPU"):
        attention_kind(dataclasses.replace(bf16, attention="cudnn"), "cpu")
    with pytest.raises(ValueError, match="attention='flash' is not one of"):
        ModelConfig.tiny(attention="flash")


def test_target_backend_picks_the_kernels_of_the_platform_being_planned():
    # The planner lowers a GPU run's programs on a CPU host: inside target_backend
    # the kernel choice (and config validation) follows the target, not the host.
    from gdpo_jax.models.attention import attention_kind, effective_backend, target_backend
    from gdpo_jax.train.config import ConfigError, base_config, validate_config

    bf16 = ModelConfig.tiny(dtype="bfloat16")
    host = jax.default_backend()
    assert attention_kind(bf16) == ("cudnn" if host == "gpu" else "xla")
    with target_backend("cuda"):
        assert effective_backend() == "gpu" and attention_kind(bf16) == "cudnn"
        with target_backend("tpu"):  # nested: the innermost wins
            assert attention_kind(bf16) == "splash"
        assert attention_kind(bf16) == "cudnn"
    assert effective_backend() == host
    c = base_config()
    c.workdir, c.model.dtype, c.model.attention = "/tmp/x", "bfloat16", "cudnn"
    if host != "gpu":
        with pytest.raises(ConfigError, match="needs a GPU"):
            validate_config(c, num_devices=1)
    with target_backend("cuda"):
        # "half" is float16 as ModelConfig reads it: the check compared the raw text.
        for dtype in ("bfloat16", "half", "f2"):
            c.model.dtype = dtype
            try:
                validate_config(c, num_devices=1)
            except ConfigError as e:  # only the attention check may not fire here
                assert "attention" not in str(e), (dtype, e)


def test_dot_product_attention_equals_einsum_path():
    """jax.nn.dot_product_attention (XLA kernel) == the grouped einsum path:
    GQA, causal + left padding, fully masked (padding) query rows included."""
    from gdpo_jax.models.attention import _attention, _dpa_attention

    cfg = ModelConfig.tiny(num_heads=4, num_kv_heads=2, head_dim=16)
    rs = np.random.RandomState(0)
    B, T, S = 3, 5, 7
    q = jnp.asarray(rs.randn(B, T, 4, 16), jnp.float32)
    k, v = (jnp.asarray(rs.randn(B, 2, S, 16), jnp.float32) for _ in range(2))
    key_ok = np.arange(S)[None] >= np.array([0, 3, 6])[:, None]
    allowed = jnp.asarray((np.arange(S)[None] <= np.arange(T)[:, None] + 2)[None] & key_ok[:, None])
    seen = np.asarray(allowed).any(-1)  # [B, T]
    assert not seen.all()  # some (padding) query rows see no key
    kt = k.swapaxes(-1, -2)  # the cache's key layout [B, Hkv, Dh, S]
    want = np.asarray(_attention(q, kt, v, allowed, cfg))
    got = np.asarray(_dpa_attention(q, kt, v, allowed, "xla"))
    np.testing.assert_allclose(got[seen], want[seen], rtol=1e-5, atol=1e-6)
    assert np.isfinite(got).all()  # padding rows: finite, never NaN
    # NumPy reference (GQA: query head h reads kv head h // 2) for the seen rows.
    qn, kn, vn, an = (np.asarray(a, np.float64) for a in (q, k, v, allowed))
    kv_of = np.arange(4) // 2
    s = np.einsum("bthd,bhsd->bhts", qn, kn[:, kv_of]) / 4.0
    s = np.where(an[:, None] > 0, s, -1e30)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    ref = np.einsum("bhts,bhsd->bthd", p, vn[:, kv_of])
    np.testing.assert_allclose(want[seen], ref[seen], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("T, S", [(5, 5), (5, 7), (4, 7), (6, 6)])
def test_cudnn_attention_pads_odd_lengths_to_even(monkeypatch, T, S):
    """cuDNN's masked backward pass refuses an odd query or key length ("Unsupported
    sequence length Q 33, KV 33"): an odd prompt bucket failed the train step's compile on
    a GPU. `_dpa_attention` pads both to even for cuDNN; here a stand-in kernel refuses odd
    lengths as cuDNN does and computes with XLA's, and the valid rows and gradients equal
    the unpadded einsum path's."""
    from gdpo_jax.models import attention as attn
    from gdpo_jax.models.attention import _attention

    real = jax.nn.dot_product_attention
    calls = []

    def cudnn_like(q, k, v, *, mask, implementation):
        assert implementation == "cudnn"
        if q.shape[1] % 2 or k.shape[1] % 2:
            raise NotImplementedError(
                f"Unsupported sequence length Q {q.shape[1]}, KV {k.shape[1]}."
            )
        calls.append((q.shape[1], k.shape[1]))
        return real(q, k, v, mask=mask, implementation="xla")

    monkeypatch.setattr(attn.jax.nn, "dot_product_attention", cudnn_like)
    cfg = ModelConfig.tiny(num_heads=4, num_kv_heads=2, head_dim=16)
    rs = np.random.RandomState(1)
    q = jnp.asarray(rs.randn(3, T, 4, 16), jnp.float32)
    kt = jnp.asarray(rs.randn(3, 2, 16, S), jnp.float32)
    v = jnp.asarray(rs.randn(3, 2, S, 16), jnp.float32)
    key_ok = np.arange(S)[None] >= np.array([0, 2, S - 1])[:, None]  # left padding
    allowed = jnp.asarray(
        (np.arange(S)[None] <= np.arange(T)[:, None] + (S - T))[None] & key_ok[:, None]
    )
    seen = np.asarray(allowed).any(-1)
    w = jnp.asarray(rs.randn(3, T, 4, 16), jnp.float32) * jnp.asarray(seen)[..., None, None]

    def loss(fn, q, kt, v):
        return jnp.sum(fn(q, kt, v) * w)

    got = attn._dpa_attention(q, kt, v, allowed, "cudnn")
    want = _attention(q, kt, v, allowed, cfg)
    assert got.shape == want.shape == (3, T, 4, 16) and calls[-1] == (T + T % 2, S + S % 2)
    np.testing.assert_allclose(np.asarray(got)[seen], np.asarray(want)[seen], atol=1e-5)
    g_got = jax.grad(lambda *a: loss(lambda *b: attn._dpa_attention(*b, allowed, "cudnn"), *a),
                     argnums=(0, 1, 2))(q, kt, v)  # fmt: skip
    g_want = jax.grad(lambda *a: loss(lambda *b: _attention(*b, allowed, cfg), *a),
                      argnums=(0, 1, 2))(q, kt, v)  # fmt: skip
    for a, b in zip(g_got, g_want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def test_auto_leaves_cudnn_for_a_head_dim_it_cannot_take():
    """cuDNN flash attention takes a head dim that is a multiple of 8, <= 128 before Hopper
    (256 from it): "auto" picked it for any bf16 GPU model, and the step failed in jax's
    check. "auto" now keeps cuDNN for the head dims every GPU takes; an explicit "cudnn"
    outside cuDNN's range is one line naming the field."""
    from gdpo_jax.models.attention import attention_kind

    for head_dim, auto in ((16, "cudnn"), (128, "cudnn"), (12, "xla"), (192, "xla")):
        cfg = ModelConfig.tiny(dtype="bfloat16", head_dim=head_dim)
        assert attention_kind(cfg, "gpu") == auto, head_dim
    explicit = ModelConfig.tiny(dtype="bfloat16", head_dim=192, attention="cudnn")
    assert attention_kind(explicit, "gpu") == "cudnn"  # Hopper takes it: the user's call
    with pytest.raises(ValueError, match=r"head_dim that is a multiple of 8.*this model's is 12"):
        attention_kind(dataclasses.replace(explicit, head_dim=12), "gpu")


def test_model_with_dpa_attention_matches_einsum(models):
    """Training forward, gradients and prefill-then-decode through the cache:
    attention="dpa" equals the einsum path (f32, CPU)."""
    base = models["qwen2"]
    dpa = nnx.merge(
        nnx.graphdef(_random_model(dataclasses.replace(base.cfg, attention="dpa"))),
        nnx.state(base),
    )
    assert dpa.cfg.attention == "dpa"
    ids, mask = _batch()
    valid = np.asarray(mask, bool)
    a, b = np.asarray(_fwd(base, ids, mask)), np.asarray(_fwd(dpa, ids, mask))
    np.testing.assert_allclose(b[valid], a[valid], rtol=1e-5, atol=2e-5)
    assert np.isfinite(b).all()
    # The dpa path really ran: its padding queries read every key (_dpa_attention),
    # where the einsum path's read none, so the unused outputs there differ.
    assert (~valid).any() and np.abs(b[~valid] - a[~valid]).max() > 1e-3
    loss = lambda m: jnp.sum(m(ids, mask) ** 2 * mask[..., None])  # noqa: E731
    for x, y in zip(
        jax.tree.leaves(jax.jit(nnx.grad(loss))(base)),
        jax.tree.leaves(jax.jit(nnx.grad(loss))(dpa)),
    ):
        x, y = np.asarray(x), np.asarray(y)
        assert np.abs(x - y).max() <= 1e-5 * np.abs(x).max() + 1e-7
    step = jax.jit(lambda m, x, k, c: m(x, k, cache=c))
    outs = []
    for m in (base, dpa):
        logits, cache = step(m, ids[:, :6], mask[:, :6], m.init_cache(4, 9))  # prefill 6
        nxt, _ = step(m, ids[:, 6:7], mask[:, 6:7], cache)  # one decode step
        outs.append(np.concatenate([np.asarray(logits), np.asarray(nxt)], 1))
    np.testing.assert_allclose(outs[1][valid[:, :7]], outs[0][valid[:, :7]], rtol=1e-5, atol=2e-5)


def test_attention_masks_hand_worked():
    """Which keys each new query reads: no cache, a scalar cache index, a per-row one."""
    from gdpo_jax.models.attention import attention_masks

    T, F = True, False
    # No cache: causal, and only valid keys (the first token is left padding).
    key_mask, allowed, self_attend, per_row = attention_masks(jnp.array([[0, 1, 1]]), None)
    assert self_attend and not per_row
    np.testing.assert_array_equal(key_mask, [[F, T, T]])
    np.testing.assert_array_equal(allowed[0], [[F, F, F], [F, T, F], [F, T, T]])

    def cache(mask, index):
        z = jnp.zeros((1, len(mask), 1, 1, len(mask[0])))
        return KVCache(k=z, v=z, mask=jnp.array(mask), index=jnp.array(index))

    # Scalar index 1 into 4 slots (slot 0 holds a token): 2 new tokens at slots 1, 2.
    c = cache([[T, F, F, F]], 1)
    key_mask, allowed, self_attend, _ = attention_masks(jnp.array([[1, 1]]), c)
    assert not self_attend
    np.testing.assert_array_equal(key_mask, [[T, T, T, F]])
    np.testing.assert_array_equal(allowed[0], [[T, T, F, F], [T, T, T, F]])
    # The same call on a fresh cache (a prefill at 0) attends to its own tokens.
    _, allowed, self_attend, _ = attention_masks(jnp.array([[1, 1]]), cache([[F] * 4], 0), True)
    assert self_attend and allowed.shape == (1, 2, 2)

    # Per-row index: row 0 writes slot 1, row 1 (a padded token) writes slot 3.
    c = cache([[T, F, F, F], [T, T, T, F]], [1, 3])
    key_mask, allowed, self_attend, per_row = attention_masks(jnp.array([[1], [0]]), c)
    assert per_row and not self_attend
    np.testing.assert_array_equal(key_mask, [[T, T, F, F], [T, T, T, F]])
    np.testing.assert_array_equal(allowed[:, 0], [[T, T, F, F], [T, T, T, F]])
    with pytest.raises(ValueError, match="one token per step"):
        attention_masks(jnp.array([[1, 1], [1, 1]]), c)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_fields_a_config_leaves_out_take_transformers_defaults(model_type):
    """A config.json with only the required fields reads as transformers' config class
    of that type reads it (Qwen2's 32768 positions were 2048 here, Llama's EOS id 2 was
    none, so sampling ran past it)."""
    transformers = pytest.importorskip("transformers")
    minimal = dict(
        vocab_size=64,
        hidden_size=1024,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=32,
    )
    ours = ModelConfig.from_hf({"model_type": model_type, **minimal})
    ref = transformers.AutoConfig.for_model(model_type, **minimal)
    rope = getattr(ref, "rope_parameters", None) or {"rope_theta": ref.rope_theta}
    expect = dict(
        num_kv_heads=ref.num_key_value_heads,
        head_dim=getattr(ref, "head_dim", None) or ref.hidden_size // ref.num_attention_heads,
        rope_theta=rope["rope_theta"],
        rms_norm_eps=ref.rms_norm_eps,
        tie_word_embeddings=ref.tie_word_embeddings,
        max_position_embeddings=ref.max_position_embeddings,
        bos_token_id=ref.bos_token_id,
        eos_token_id=ref.eos_token_id,
        pad_token_id=ref.pad_token_id,
    )
    assert {k: getattr(ours, k) for k in expect} == expect
    # What config.json says still wins, an explicit null included.
    given = ModelConfig.from_hf(
        {"model_type": model_type, **minimal, "max_position_embeddings": 512, "eos_token_id": None}
    )
    assert given.max_position_embeddings == 512 and given.eos_token_id is None


def test_a_kernel_the_model_cannot_use_is_a_config_error_before_the_build(monkeypatch):
    """An explicit cudnn with a head dim cuDNN cannot take failed in the first compile
    (a traceback from jax); the build refuses it in one line, and so does the planner."""
    from gdpo_jax.backend import target_backend
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.train import build
    from gdpo_jax.train.schema import base_config

    c = base_config()
    c.model.tokenizer = "synthetic_bpe"
    c.model.dtype, c.model.attention = "bfloat16", "cudnn"
    c.model.tiny.head_dim = 12
    with target_backend("cuda"), pytest.raises(ConfigError, match="head_dim that is a multiple"):
        build.build_model(c, None)


_HF_LLAMA = {
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
}


@pytest.mark.parametrize(
    "where",
    [
        {"partial_rotary_factor": 0.5},
        {
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            }
        },
    ],
)
def test_a_partial_rotary_factor_is_refused(where):
    # It was ignored: a checkpoint rotating half of each head loaded as a full rotation.
    with pytest.raises(ValueError, match=r"partial_rotary_factor=0\.5 is not supported"):
        ModelConfig.from_hf({**_HF_LLAMA, **where})
    full = ModelConfig.from_hf({**_HF_LLAMA, "partial_rotary_factor": 1.0})
    assert full.rope_scaling is None and full.head_dim == 8
