"""The Pallas TPU splash-attention path (model.attention="splash").

On CPU the kernel runs in Pallas interpret mode: the same kernel code, so its
maths is checked here against NumPy and against the einsum path (itself checked
against transformers). With libtpu installed (the [aot] extra), the model is
also compiled for an abstract TPU: the kernel lowers to Mosaic, and it needs
less temporary memory than the einsum path.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gdpo_jax.backend import target_backend
from gdpo_jax.models import ModelConfig
from gdpo_jax.models.attention import attention_kind
from gdpo_jax.models.sharding import abstract_model
from gdpo_jax.models.splash import (
    SPLASH_BLOCK,
    prompt_rows_mask,
    splash_attention,
    splash_prompt_rows,
)
from gdpo_jax.scale import targets as targets_lib
from gdpo_jax.sharding import make_mesh
from tests._hlo import custom_call_targets
from tests.test_models import _random_model

needs_tpu = pytest.mark.skipif(
    not targets_lib.has_module("libtpu"), reason='needs the [aot] extra: pip install -e ".[aot]"'
)


def _numpy_attention(q, k, v, mask):
    """Causal GQA attention of valid tokens over the valid keys before them.
    q [B,T,Hq,D], k/v [B,T,Hkv,D] (float64), mask [B,T] -> [B,T,Hq,D]."""
    B, T, Hq, D = q.shape
    G = Hq // k.shape[2]
    out = np.zeros_like(q)
    for b in range(B):
        for h in range(Hq):
            for t in range(T):
                keys = [s for s in range(t + 1) if mask[b, s]]
                if not mask[b, t] or not keys:
                    continue
                s = np.array([q[b, t, h] @ k[b, j, h // G] for j in keys]) / np.sqrt(D)
                p = np.exp(s - s.max())
                out[b, t, h] = (p / p.sum()) @ v[b, keys, h // G]
    return out


def _mask(B, T):
    """Row 0 full, row 1 left-padded by 5, row 2 right-padded after 11 tokens."""
    m = np.ones((B, T), np.int32)
    m[1, :5] = 0
    m[2, 11:] = 0
    return m


def test_splash_kernel_equals_numpy_attention():
    # T = 20 is padded to one 128-token block inside; GQA: 4 query heads on 2 kv heads.
    B, T, Hq, Hkv, D = 3, 20, 4, 2, 16
    rs = np.random.RandomState(0)
    q, k, v = rs.randn(B, T, Hq, D), rs.randn(B, T, Hkv, D), rs.randn(B, T, Hkv, D)
    mask = _mask(B, T)
    kt = jnp.asarray(k.transpose(0, 2, 3, 1), jnp.float32)  # the cache layout [B,Hkv,D,T]
    vv = jnp.asarray(v.transpose(0, 2, 1, 3), jnp.float32)  # [B,Hkv,T,D]
    got = np.asarray(splash_attention(jnp.asarray(q, jnp.float32), kt, vv, jnp.asarray(mask)))
    assert T % SPLASH_BLOCK and got.shape == (B, T, Hq, D) and np.isfinite(got).all()
    want = _numpy_attention(q, k, v, mask)
    valid = mask.astype(bool)
    np.testing.assert_allclose(got[valid], want[valid], rtol=1e-5, atol=1e-5)


def _pair(**kw):
    """The same random weights under the einsum path and the splash kernel."""
    base = _random_model(ModelConfig.tiny(**kw))
    graphdef = nnx.graphdef(abstract_model(ModelConfig.tiny(**kw, attention="splash")))
    splash = nnx.merge(graphdef, nnx.state(base))
    return base, splash


def _loss(m, ids, mask):
    return jnp.sum(m(ids, mask) ** 2 * mask[..., None])


def test_model_with_splash_attention_matches_einsum():
    """Logits and gradients of the training forward (Qwen3-like: qk-norm, GQA)."""
    base, splash = _pair(model_type="qwen3", qk_norm=True, head_dim=24)
    assert splash.cfg.attention == "splash" and attention_kind(splash.cfg, "cpu") == "splash"
    B, T = 3, 20
    ids = jnp.asarray(np.random.RandomState(1).randint(3, 256, (B, T)), jnp.int32)
    mask = jnp.asarray(_mask(B, T))
    valid = np.asarray(mask, bool)
    fwd = jax.jit(lambda m: m(ids, mask))
    a, b = np.asarray(fwd(base)), np.asarray(fwd(splash))
    np.testing.assert_allclose(b[valid], a[valid], rtol=1e-5, atol=2e-5)
    grad = jax.jit(nnx.grad(lambda m: _loss(m, ids, mask)))
    for x, y in zip(jax.tree.leaves(grad(base)), jax.tree.leaves(grad(splash))):
        x, y = np.asarray(x), np.asarray(y)
        assert np.abs(x - y).max() <= 1e-5 * np.abs(x).max() + 1e-7


@pytest.mark.parametrize("attention", ["xla", "splash"])
def test_fresh_cache_prefill_equals_reading_the_cache(attention):
    """A prefill into a fresh cache (fresh_cache=True: the prompt attends to itself,
    which lets splash run) gives the logits and cache of attending through the
    cache's slots, and the next decode step reads that cache alike."""
    base, splash = _pair()
    model = splash if attention == "splash" else base
    B, P = 3, 12
    ids = jnp.asarray(np.random.RandomState(3).randint(3, 256, (B, P + 1)), jnp.int32)
    mask = jnp.asarray(np.concatenate([_mask(B, P), np.ones((B, 1), np.int32)], 1))
    valid = np.asarray(mask[:, :P], bool)
    step = jax.jit(lambda m, x, k, c, fresh: m(x, k, cache=c, fresh_cache=fresh), static_argnums=4)
    outs = []
    for fresh in (False, True):
        logits, cache = step(model, ids[:, :P], mask[:, :P], model.init_cache(B, P + 4), fresh)
        nxt, _ = step(model, ids[:, P:], mask[:, P:], cache, False)  # one decode step
        outs.append((np.asarray(logits), cache, np.asarray(nxt)))
    (a, ca, na), (b, cb, nb) = outs
    np.testing.assert_allclose(b[valid], a[valid], rtol=1e-5, atol=2e-5)
    # The same slots hold the same keys and values (padding slots hold what padding
    # positions computed, which differs between the two and is never read).
    np.testing.assert_array_equal(np.asarray(cb.mask), np.asarray(ca.mask))
    assert int(cb.index) == int(ca.index) == P
    slots = np.asarray(ca.mask)  # [B, S]
    for name, axis in (("k", -1), ("v", 3)):  # to [L, B, S, Hkv, Dh], then the valid slots
        x, y = (np.moveaxis(np.asarray(getattr(c, name)), axis, 2)[:, slots] for c in (ca, cb))
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(nb, na, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("axis_types", ["explicit", "auto"])
def test_splash_under_a_mesh_equals_unsharded(axis_types):
    """Batch over (data, fsdp), heads over tensor: the kernel runs per shard
    (shard_map) and gives the unsharded einsum path's logits and gradients."""
    base, splash = _pair()
    B, T = 4, 12
    ids = jnp.asarray(np.random.RandomState(2).randint(3, 256, (B, T)), jnp.int32)
    mask = jnp.asarray(_mask(B, T))
    valid = np.asarray(mask, bool)
    want = np.asarray(jax.jit(lambda m: m(ids, mask))(base))
    want_g = jax.tree.leaves(jax.jit(nnx.grad(lambda m: _loss(m, ids, mask)))(base))
    mesh = make_mesh((2, 2, 2), axis_types=axis_types)
    with jax.set_mesh(mesh):
        got = np.asarray(jax.jit(lambda m: m(ids, mask))(splash))
        got_g = jax.tree.leaves(jax.jit(nnx.grad(lambda m: _loss(m, ids, mask)))(splash))
    np.testing.assert_allclose(got[valid], want[valid], rtol=1e-5, atol=2e-5)
    for x, y in zip(want_g, got_g):
        x, y = np.asarray(x), np.asarray(y)
        assert np.abs(x - y).max() <= 1e-5 * np.abs(x).max() + 1e-7


def test_splash_choice_and_config_errors():
    from gdpo_jax.train.config import ConfigError, base_config, validate_config

    bf16 = ModelConfig.tiny(dtype="bfloat16")
    assert attention_kind(bf16, "tpu") == "splash" and attention_kind(bf16, "cpu") == "xla"
    with pytest.raises(ValueError, match="'splash' is a TPU kernel"):
        attention_kind(ModelConfig.tiny(attention="splash"), "gpu")
    c = base_config()
    c.workdir, c.model.attention = "/tmp/x", "splash"
    with pytest.raises(ConfigError, match="config.model.attention='splash'"):
        validate_config(c, num_devices=1)  # the CLI refuses it off TPU, before any work
    c.model.tokenizer = "toy_words"  # a random-init model names its tokenizer
    with target_backend("tpu"):  # the planner's TPU target: the whole config validates
        validate_config(c, num_devices=1)


@pytest.fixture
def _libtpu_env(monkeypatch):
    """libtpu asks the machine what TPU it is unless told."""
    monkeypatch.setitem(os.environ, "TPU_ACCELERATOR_TYPE", "v5litepod-4")
    monkeypatch.setitem(os.environ, "TPU_WORKER_HOSTNAMES", "localhost")


@needs_tpu
def test_splash_compiles_for_a_tpu_and_saves_temporaries(_libtpu_env):
    """The training gradient compiled for an abstract TPU v5e chip: "auto" picks
    splash there, which lowers to a Mosaic kernel and needs less temporary memory
    than the einsum path's [T, T] scores (T = 1024, bf16)."""
    from jax.experimental import topologies

    device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    B, T = 2, 1024
    ids = jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=sharding)

    def compiled(attention):
        cfg = ModelConfig.tiny(dtype="bfloat16", head_dim=128, attention=attention)
        graphdef, state = nnx.split(nnx.eval_shape(lambda: _random_model(cfg)))
        state = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), state
        )

        def loss(state, ids):
            return jnp.sum(nnx.merge(graphdef, state)(ids).astype(jnp.float32))

        with target_backend("tpu"):
            assert attention_kind(cfg) == ("splash" if attention == "auto" else attention)
            return jax.jit(jax.grad(loss)).lower(state, ids).compile()

    splash, xla = compiled("auto"), compiled("xla")
    targets = [custom_call_targets(c.as_text()) for c in (splash, xla)]
    assert "tpu_custom_call" in targets[0] and "tpu_custom_call" not in targets[1], targets[1]
    temps = [c.memory_analysis().temp_size_in_bytes for c in (splash, xla)]
    assert temps[0] < temps[1], temps


# ------------------------------------------------------ a prompt's rows in one call
def _numpy_prompt_rows(q, pk, pv, pmask, k, v, mask, R):
    """Row b's query t over its prompt's valid slots then its own valid keys <= t.
    q [B,T,Hq,D], pk/pv [U,P,Hkv,D], pmask [U,P], k/v [B,T,Hkv,D], mask [B,T]."""
    B, T, Hq, D = q.shape
    G = Hq // k.shape[2]
    out = np.zeros_like(q)
    for b in range(B):
        u = b // R
        for h in range(Hq):
            keys = np.concatenate([pk[u, :, h // G], k[b, :, h // G]])
            vals = np.concatenate([pv[u, :, h // G], v[b, :, h // G]])
            for t in range(T):
                ok = [s for s in range(pk.shape[1]) if pmask[u, s]]
                ok += [pk.shape[1] + s for s in range(t + 1) if mask[b, s]]
                if not mask[b, t]:
                    continue
                s = keys[ok] @ q[b, t, h] / np.sqrt(D)
                p = np.exp(s - s.max())
                out[b, t, h] = (p / p.sum()) @ vals[ok]
    return out


def test_prompt_rows_mask_is_its_rule_in_numpy_and_in_the_kernel_form():
    rows, prompt, row_len = 3, 256, 128
    m = prompt_rows_mask(rows, prompt, row_len)
    assert m.shape == (rows * row_len, prompt + rows * row_len)
    want = np.zeros(m.shape, bool)
    for i in range(m.shape[0]):
        want[i, :prompt] = True
        r, t = divmod(i, row_len)
        want[i, prompt + r * row_len : prompt + r * row_len + t + 1] = True
    np.testing.assert_array_equal(m[:, :], want)
    # The form the kernel evaluates on traced block indices (lax.div, not //).
    qi, ki = jnp.arange(m.shape[0])[:, None], jnp.arange(m.shape[1])[None, :]
    np.testing.assert_array_equal(np.asarray(m.mask_function(qi, ki)), want)
    assert m == prompt_rows_mask(rows, prompt, row_len) != prompt_rows_mask(rows, prompt, 256)


def test_splash_prompt_rows_equals_numpy_attention():
    """U = 2 prompts x R = 3 rows: prompt 0 left padded, prompt 1 of one real slot;
    rows of full, right-padded and one-token lengths; GQA 4 on 2 heads; T = 7."""
    U, R, P, T, Hq, Hkv, D = 2, 3, SPLASH_BLOCK, 7, 4, 2, 8
    B = U * R
    rs = np.random.RandomState(1)
    q, k, v = rs.randn(B, T, Hq, D), rs.randn(B, T, Hkv, D), rs.randn(B, T, Hkv, D)
    pk, pv = rs.randn(U, P, Hkv, D), rs.randn(U, P, Hkv, D)
    pmask = np.zeros((U, P), np.int32)
    pmask[0, 100:], pmask[1, -1] = 1, 1
    mask = (np.arange(T)[None] < np.array([7, 4, 1, 7, 6, 2])[:, None]).astype(np.int32)
    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    args = [
        f32(q),
        f32(pk.transpose(0, 2, 3, 1)),  # the cache layouts: kt [U,Hkv,D,P], v [U,Hkv,P,D]
        f32(pv.transpose(0, 2, 1, 3)),
        jnp.asarray(pmask),
        f32(k.transpose(0, 2, 3, 1)),
        f32(v.transpose(0, 2, 1, 3)),
        jnp.asarray(mask),
    ]
    got = np.asarray(splash_prompt_rows(*args))
    assert got.shape == (B, T, Hq, D) and np.isfinite(got).all()
    want = _numpy_prompt_rows(q, pk, pv, pmask, k, v, mask, R)
    valid = mask.astype(bool)
    np.testing.assert_allclose(got[valid], want[valid], rtol=1e-5, atol=1e-5)

    short = list(args)
    short[1], short[2], short[3] = args[1][..., :100], args[2][:, :, :100], args[3][:, :100]
    with pytest.raises(ValueError, match="cache width \\(100\\) a multiple of 128"):
        splash_prompt_rows(*short)
    with pytest.raises(ValueError, match="each shard must hold whole prompts"):
        with jax.set_mesh(make_mesh((4, 2, 1))):  # 2 prompts over 8 batch shards
            splash_prompt_rows(*args)
