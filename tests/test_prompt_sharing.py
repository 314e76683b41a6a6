"""Each prompt run once per micro-batch (`algo.share_prompt`) == the per-row forward.

References: the model's ordinary forward over [prompt | completion] rows (the
path the HF parity tests pin), the step without sharing, hand-worked row
layouts, and SGD updates written out by hand on whole-group mini-batches.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gdpo_jax.models import ModelConfig
from gdpo_jax.models.prompt_sharing import shared_prompt_hidden
from gdpo_jax.models.sharding import create_model
from gdpo_jax.train import distributed
from gdpo_jax.train import mesh as mesh_lib
from gdpo_jax.train.blocks import from_blocks, to_blocks
from gdpo_jax.train.config import base_config
from gdpo_jax.train.step import StepConfig
from gdpo_jax.train.step_config import check_group_prompts, share_prompt_blocker
from tests._hlo import custom_call_targets
from tests.test_train_sharded import SC, _run
from tests.test_train_step import (
    CFG,
    NUM_GROUPS,
    G,
    K,
    N,
    _sgd_step,
    make_batch,
    np_advantages,
    reference_loss,
)


def shared_batch(seed: int, **kw) -> dict[str, np.ndarray]:
    """make_batch with one prompt per group (row g*G's), as rollouts give."""
    b = make_batch(seed, **kw)
    for k in ("prompt_ids", "prompt_mask"):
        b[k] = np.repeat(b[k][::G], G, axis=0)
    return b


def _rows(U: int, R: int, P: int, C: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    pm = np.ones((U, P), np.int32)
    pm[0, :2] = 0
    pm[-1, :-1] = 0  # a prompt of one real token: its prefix is empty
    lens = r.integers(1, C + 1, U * R)
    cm = (np.arange(C)[None] < lens[:, None]).astype(np.int32)
    return {
        "prompt_ids": np.repeat(np.where(pm, r.integers(3, vocab, (U, P)), 0), R, 0),
        "prompt_mask": np.repeat(pm, R, 0),
        "completion_ids": np.where(cm, r.integers(3, vocab, (U * R, C)), 0).astype(np.int32),
        "completion_mask": cm,
    }


# ------------------------------------------------------------------ the model
def _small(**kw) -> ModelConfig:
    dims = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2)
    return ModelConfig.tiny(**{**dims, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, **kw})


@pytest.mark.parametrize(
    "scan,extra",
    [
        (True, {}),
        (False, {}),
        (True, {"qk_norm": True, "attention_bias": True, "remat": True}),
        # The completions' attention through a fused kernel (_attention_prefix_kernel):
        # jax.nn.dot_product_attention's XLA kernel (cuDNN's API), and splash (interpret).
        (True, {"attention": "dpa"}),
        (False, {"attention": "splash"}),
    ],
)
def test_shared_prompt_hidden_equals_per_row_forward_and_its_gradient(scan, extra):
    cfg = _small(scan_layers=scan, **extra)
    graphdef, params = nnx.split(create_model(cfg, seed=1))
    # The reference is the per-row forward with the einsum attention.
    ref_graphdef = nnx.graphdef(create_model(dataclasses.replace(cfg, attention="xla"), seed=1))
    U, R, P, C = 3, 4, 6, 5
    b = {k: jnp.asarray(v) for k, v in _rows(U, R, P, C, 64).items()}
    valid = b["completion_mask"][..., None].astype(jnp.float32)
    probe = jax.random.normal(jax.random.key(0), (U * R, C, 32))

    def per_row(p):
        m = nnx.merge(ref_graphdef, p)
        ids = jnp.concatenate([b["prompt_ids"], b["completion_ids"]], 1)
        mask = jnp.concatenate([b["prompt_mask"], b["completion_mask"]], 1)
        return m(ids, mask, return_hidden=True)[:, P - 1 : -1]

    def shared(p):
        m = nnx.merge(graphdef, p)
        return shared_prompt_hidden(
            m, b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"], group=R
        )

    want, got = jax.jit(per_row)(params), jax.jit(shared)(params)
    assert got.shape == want.shape == (U * R, C, 32)
    np.testing.assert_allclose(np.asarray(got * valid), np.asarray(want * valid), atol=2e-5)
    g_want, g_got = (
        jax.jit(jax.grad(lambda p, f=f: jnp.sum(f(p) * probe * valid)))(params)
        for f in (per_row, shared)
    )
    jax.tree.map(
        lambda a, c: np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-4, atol=5e-5),
        g_got,
        g_want,
    )


def _scans(jaxpr) -> int:
    """Outermost `scan`s in a closed jaxpr (the layer loops): those inside jit, remat or
    custom VJPs count, scans nested in a scan or in a Pallas kernel (splash) do not."""
    n = 0
    for eqn in jaxpr.jaxpr.eqns if hasattr(jaxpr, "jaxpr") else jaxpr.eqns:
        if eqn.primitive.name == "scan":
            n += 1
        elif "pallas" not in eqn.primitive.name:
            n += sum(_scans(sub) for sub in jax.core.jaxprs_in_params(eqn.params))
    return n


@pytest.mark.parametrize("extra", [{}, {"remat": True}, {"attention": "splash"}])
def test_one_loop_equals_the_two_calls_and_reads_the_stacked_weights_in_one_scan(extra):
    """The prompts' and the rows' passes in one scan over the stacked layers
    (`Transformer.forward_shared_prompt`, the default under the scan): the
    two calls' hidden states and gradients, from one `scan` where the two
    calls run two (a prefill into a cache, the rows over it)."""
    cfg = _small(**extra)
    graphdef, params = nnx.split(create_model(cfg, seed=4))
    U, R, P, C = 3, 2, 7, 4
    b = {k: jnp.asarray(v) for k, v in _rows(U, R, P, C, 64, seed=5).items()}
    valid = b["completion_mask"][..., None].astype(jnp.float32)
    probe = jax.random.normal(jax.random.key(2), (U * R, C, 32)) * valid

    def hidden(p, one_loop):
        m = nnx.merge(graphdef, p)
        return shared_prompt_hidden(m, *(b[k] for k in b), group=R, one_loop=one_loop)

    def loss(p, one_loop):
        return jnp.sum(hidden(p, one_loop) * probe)

    got, want = (jax.jit(hidden, static_argnums=1)(params, o) for o in (True, False))
    np.testing.assert_allclose(np.asarray(got * valid), np.asarray(want * valid), atol=1e-6)
    g_got, g_want = (jax.jit(jax.grad(loss), static_argnums=1)(params, o) for o in (True, False))
    for x, y in zip(jax.tree.leaves(g_want), jax.tree.leaves(g_got)):
        x, y = np.asarray(x), np.asarray(y)
        assert np.abs(x - y).max() <= 1e-5 * np.abs(x).max() + 1e-7
    # The default under the scan is the one loop.
    default = jax.jit(lambda p: hidden(p, None))(params)
    np.testing.assert_array_equal(np.asarray(default), np.asarray(got))
    assert [_scans(jax.make_jaxpr(hidden, static_argnums=1)(params, o)) for o in (True, False)] == [
        1,
        2,
    ]
    with pytest.raises(ValueError, match="drop layer_params"):
        m = nnx.merge(graphdef, params)
        shared_prompt_hidden(m, *(b[k] for k in b), group=R, one_loop=True, layer_params=())


@pytest.mark.parametrize("axis_types", ["explicit", "auto"])
def test_shared_prompt_splash_under_a_mesh_equals_unsharded(axis_types):
    """The prompt-prefixed splash call per shard (shard_map with the keys' own
    segment ids): the unsharded einsum path's hidden states and gradients."""
    cfg = _small(num_layers=1)
    model = create_model(cfg, seed=2)
    splash = nnx.merge(
        nnx.graphdef(create_model(dataclasses.replace(cfg, attention="splash"), seed=2)),
        nnx.state(model),
    )
    U, R, P, C = 4, 2, 5, 7
    b = _rows(U, R, P, C, 64, seed=3)
    args = [jnp.asarray(b[k]) for k in b]
    probe = jax.random.normal(jax.random.key(1), (U * R, C, 32)) * args[3][..., None]

    def loss(m):
        return jnp.sum(shared_prompt_hidden(m, *args, group=R) * probe)

    want = jax.jit(nnx.value_and_grad(loss))(model)
    with jax.set_mesh(mesh_lib.make_mesh((2, 2, 2), axis_types=axis_types)):
        got = jax.jit(nnx.value_and_grad(loss))(splash)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
    for x, y in zip(jax.tree.leaves(want[1]), jax.tree.leaves(got[1])):
        x, y = np.asarray(x), np.asarray(y)
        assert np.abs(x - y).max() <= 1e-5 * np.abs(x).max() + 1e-7


def test_shared_prompt_hidden_rejects_rows_that_are_not_whole_groups():
    model = create_model(CFG, seed=0)
    b = _rows(2, 3, 4, 3, 64)
    with pytest.raises(ValueError, match="not whole groups of 4"):
        shared_prompt_hidden(model, *(b[k] for k in b), group=4)


# ------------------------------------------------------------------ the layout
def test_block_layout_by_hand():
    """Mini-batch u = units u, u + U, ...; micro-batch m of it = its units m, m + M, ..."""
    x = jnp.arange(8)
    # Hand-worked. Rows: U=2 -> rows 0::2, 1::2.
    np.testing.assert_array_equal(to_blocks(x, 2, 1), [[[0, 2, 4, 6]], [[1, 3, 5, 7]]])
    # Groups of 2 (groups 0..3 = rows 01 23 45 67): U=2 -> groups {0, 2}, {1, 3}.
    np.testing.assert_array_equal(to_blocks(x, 2, 1, (2, 2)), [[[0, 1, 4, 5]], [[2, 3, 6, 7]]])
    # U=2 x M=2 over rows: mini 0 = rows 0 2 4 6 -> micro 0 = 0 4, micro 1 = 2 6.
    want = [[[0, 4], [2, 6]], [[1, 5], [3, 7]]]
    np.testing.assert_array_equal(to_blocks(x, 2, 2), want)
    # Whole-group mini-batches, micro-batches of rows: mini 0 = rows 0 1 4 5 -> 0 4, 1 5.
    want = [[[0, 4], [1, 5]], [[2, 6], [3, 7]]]
    np.testing.assert_array_equal(to_blocks(x, 2, 2, (2, 1)), want)
    y = jnp.arange(48).reshape(24, 2)
    for mini, micro, units in [(1, 1, (1, 1)), (2, 3, (1, 1)), (3, 2, (2, 2)), (2, 2, (3, 1))]:
        np.testing.assert_array_equal(from_blocks(to_blocks(y, mini, micro, units), units), y)


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_block_layout_keeps_every_shards_rows_on_it(shards):
    """Each block's rows, cut into `shards` equal runs, come run s from shard s."""
    n, g, mini, micro = 64, 4, 2, 2  # 16 groups: whole per shard x mini x micro up to 4 shards
    sc = StepConfig(
        num_groups=n // g, num_minibatches=mini, num_microbatches=micro, group_size=g,
        batch_shards=shards,
    )  # fmt: skip
    for units in [(1, 1), sc.layout_units(n)]:
        blocks = np.asarray(to_blocks(jnp.arange(n), mini, micro, units)).reshape(
            mini * micro, shards, -1
        )
        assert (blocks // (n // shards) == np.arange(shards)[None, :, None]).all(), units
    assert sc.layout_units(n) == (g, g)


def test_from_config_shares_only_whole_groups_per_device_micro_batch():
    c = base_config()
    c.algo.num_prompts, c.algo.group_size, c.algo.num_microbatches = 8, 4, 4
    sc = StepConfig.from_config(c, batch_shards=2)
    assert (sc.share_prompt, sc.shared_group, sc.batch_shards) == (True, 4, 2)
    assert sc.layout_units(32) == (4, 4)
    with pytest.raises(ValueError, match="share_prompt=False"):
        sc.layout_units(24)  # not the configured groups
    c.algo.num_minibatches = 2  # 8 prompts over 2 shards x 8 blocks: a group would split
    sc = StepConfig.from_config(c, batch_shards=2)
    assert not sc.share_prompt
    assert sc.layout_units(32) == (4, 1)  # mini-batches stay whole groups, micro-batches rows
    assert "num_prompts=8 is not a multiple of 2 batch shard(s) x 8" in share_prompt_blocker(
        8, 8, 2
    )
    assert share_prompt_blocker(16, 8, 2) == ""
    c.algo.num_minibatches, c.algo.share_prompt = 1, False
    sc = StepConfig.from_config(c, batch_shards=2)
    assert not sc.share_prompt and sc.shared_group == 0 and sc.layout_units(32) == (4, 4)
    c.algo.num_minibatches = (
        8  # 8 prompts, 2 shards: a shard's share of a mini-batch splits a group
    )
    assert StepConfig.from_config(c, batch_shards=2).layout_units(32) == (1, 1)


def test_check_group_prompts_names_the_first_mixed_group():
    b = shared_batch(0)
    check_group_prompts(b["prompt_ids"], b["prompt_mask"], G)
    b["prompt_ids"][2 * G + 1, -1] += 1
    with pytest.raises(ValueError, match=r"prompt_ids: group 2 \(rows 8..11\).*share_prompt=False"):
        check_group_prompts(b["prompt_ids"], b["prompt_mask"], G)


# ------------------------------------------------------------------ the step
def _share(sc: StepConfig, shards: int = 1) -> StepConfig:
    return dataclasses.replace(sc, share_prompt=True, group_size=G, batch_shards=shards)


@pytest.mark.parametrize("micro,beta,old_in_step", [(1, 0.0, False), (2, 0.04, True)])
def test_step_with_shared_prompts_equals_the_per_row_step(micro, beta, old_in_step):
    batch = shared_batch(6, with_ref=beta > 0)
    plain = StepConfig(
        num_groups=NUM_GROUPS, num_microbatches=micro, beta=beta, old_logp_in_step=old_in_step
    )
    outs = []
    for sc in (plain, _share(plain)):
        _, state, step = _sgd_step(sc, create_model(CFG, seed=0))
        b = {k: v for k, v in batch.items() if not (old_in_step and k == "old_logp")}
        new_state, metrics = step(state, distributed.to_global(b, None))
        lp = step.logprobs(new_state.params, distributed.to_global(b, None))
        outs.append((jax.tree.map(np.asarray, new_state.params), metrics, np.asarray(lp)))
    (p0, m0, l0), (p1, m1, l1) = outs
    jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6), p1, p0)
    assert m0.keys() == m1.keys()
    for k in m0:
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-5)


def test_shared_minibatches_are_whole_groups_updated_in_order():
    """2 mini-batches with sharing == SGD by hand on groups {0, 2} then {1, 3}
    (whole groups, as verl's), each with the whole batch's advantages."""
    batch = shared_batch(3)
    sc = _share(StepConfig(num_groups=NUM_GROUPS, num_minibatches=2))
    graphdef, state, step = _sgd_step(sc, create_model(CFG, seed=0))
    params = jax.tree.map(jnp.asarray, jax.tree.map(np.asarray, state.params))
    got, _ = step(state, distributed.to_global(batch, None))
    adv = np_advantages(batch["rewards"], batch["group_ids"], "gdpo", np.ones(K))
    groups = np.arange(N) // G
    for rows in (groups % 2 == 0, groups % 2 == 1):
        sub = {k: jnp.asarray(v[rows]) for k, v in batch.items()}
        g = jax.grad(reference_loss)(params, graphdef, sub, jnp.asarray(adv[rows], jnp.float32), sc)
        params = jax.tree.map(lambda p, d: p - d, params, g)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6),
        got.params,
        params,
    )


@pytest.mark.parametrize("axis_types", ["explicit", "auto"])
def test_shared_step_sharded_equals_unsharded(axis_types):
    batches = [shared_batch(10, with_ref=True), shared_batch(11, with_ref=True)]
    batches[1]["valid"][-G:] = False
    ref_state, ref_metrics, ref_step = _run(None, batches, _share(SC))
    mesh = mesh_lib.make_mesh((2, 1, 4), axis_types=axis_types)  # 2 batch shards
    assert mesh_lib.batch_axis_size(mesh) == 2
    state, metrics, step = _run(mesh, batches, _share(SC, shards=2))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6),
        state.params,
        ref_state.params,
    )
    for got, ref in zip(metrics, ref_metrics):
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=1e-6, err_msg=k)
    assert step.compile_count() == 1
    # The log-prob pass under the mesh: the unsharded shared pass's values.
    want = ref_step.logprobs(ref_state.params, distributed.to_global(batches[0], None))
    got = step.logprobs(state.params, distributed.to_global(batches[0], mesh))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    # Built for 1 shard: on 2 the layout is the same (4 groups, 2 micro-batches);
    # on 4 a shard's micro-batch would be half a group, so the layout differs.
    assert _share(SC).layout_units(N) == _share(SC, shards=2).layout_units(N) == (G, G)
    mesh4 = mesh_lib.make_mesh((4, 1, 2), axis_types=axis_types)
    with pytest.raises(ValueError, match="built for 1 batch shard"):
        _run(mesh4, batches[:1], _share(SC, shards=1))


def test_minibatches_are_the_same_on_any_mesh_with_or_without_prompt_sharing():
    """2 mini-batches, per row or with shared prompts, on one device or two batch
    shards: one result, because each mini-batch holds the same whole groups
    (the layout once cut each shard's rows into contiguous runs instead)."""
    batches = [shared_batch(12, with_ref=True)]
    base = dataclasses.replace(SC, num_minibatches=2, num_microbatches=1, group_size=G)
    ref_state, ref_metrics, _ = _run(None, batches, base)
    # Two devices (fewer XLA:CPU device threads in collectives: limits.md).
    mesh = mesh_lib.make_mesh((2, 1, 1), devices=jax.devices()[:2])
    for share, m in [(True, None), (False, mesh), (True, mesh)]:
        sc = dataclasses.replace(base, share_prompt=share, batch_shards=1 if m is None else 2)
        assert sc.layout_units(N) == (G, G)
        state, metrics, _ = _run(m, batches, sc)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(
                np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6
            ),
            state.params,
            ref_state.params,
        )
        for k in ref_metrics[0]:
            np.testing.assert_allclose(
                metrics[0][k], ref_metrics[0][k], rtol=1e-4, atol=1e-6, err_msg=k
            )


# ------------------------------------------------------------------ accelerator kernels
# P, C: libtpu's compile time grows with them (256 / 512 took 1.4-2x as long as
# 128 / 128 here), the GPU compiler's does not.
@pytest.mark.parametrize(
    "target,P,C",
    [pytest.param("v5e-4", 128, 128, id="v5e-4"), pytest.param("1xh100", 256, 512, id="1xh100")],
)
def test_shared_prompt_kernel_compiles_for_accelerators_and_saves_temporaries(
    target, P, C, monkeypatch
):
    """The training gradient of the shared-prompt forward compiled for an abstract
    TPU v5e / H100 (bf16): "auto" routes the completions' attention through splash
    / cuDNN flash attention, which needs less temporary memory than the einsum
    path's [B, Hq, C, P + C] scores (8 x 4 x 128 x 256 of them at P = C = 128)."""
    from jax.sharding import SingleDeviceSharding

    from gdpo_jax.backend import target_backend
    from gdpo_jax.models.attention import attention_kind
    from gdpo_jax.scale import targets as targets_lib
    from gdpo_jax.scale.plan import _cudnn_on_host
    from tests.test_models import _random_model

    tgt = targets_lib.parse_target(target)
    if not targets_lib.has_module("libtpu" if tgt.platform == "tpu" else "jax_plugins.xla_cuda12"):
        pytest.skip('needs the [aot] extra: pip install -e ".[aot]"')
    if tgt.platform == "cuda" and not _cudnn_on_host():
        pytest.skip("lowering cuDNN attention needs cuDNN on this host (nvidia-cudnn-cu12)")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-4")  # libtpu asks the machine otherwise
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    sharding = SingleDeviceSharding(targets_lib.target_devices(tgt)[0])
    backend, marker = ("tpu", "tpu_custom_call") if tgt.platform == "tpu" else ("gpu", "cudnn")
    U, R = 2, 4
    args = [
        jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding)
        for shape in ((U * R, P), (U * R, P), (U * R, C), (U * R, C))
    ]

    def compiled(attention):
        cfg = ModelConfig.tiny(dtype="bfloat16", head_dim=128, attention=attention)
        graphdef, state = nnx.split(nnx.eval_shape(lambda: _random_model(cfg)))
        state = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), state
        )

        def loss(state, *batch):
            h = shared_prompt_hidden(nnx.merge(graphdef, state), *batch, group=R)
            return jnp.sum(h.astype(jnp.float32))

        with target_backend(backend):
            assert (attention_kind(cfg) != "xla") == (attention == "auto")
            return jax.jit(jax.grad(loss)).lower(state, *args).compile()

    kernel, xla = compiled("auto"), compiled("xla")

    # In the custom calls' targets: "cudnn" also named a test's function in the metadata.
    def calls_kernel(compiled) -> bool:
        return any(marker in t for t in custom_call_targets(compiled.as_text()))

    assert calls_kernel(kernel) and not calls_kernel(xla)
    temps = [c.memory_analysis().temp_size_in_bytes for c in (kernel, xla)]
    assert temps[0] < temps[1], temps


def test_shared_prompt_splash_gradient_compiles_for_a_sharded_tpu(monkeypatch):
    """Regression: the gradient of the shared-prompt forward through splash, batch
    sharded over a v5e 2x2's four chips, head_dim 128, a 16-token prompt bucket.
    Padding the prompt's K/V to the kernel's block (then sliced back by the pad's
    gradient) failed libtpu's compile with "Bitcast cannot have different shape
    sizes"; the prompt's tokens are padded instead, before its prefix pass."""
    from gdpo_jax.backend import target_backend
    from gdpo_jax.scale import targets as targets_lib
    from tests.test_models import _random_model

    if not targets_lib.has_module("libtpu"):
        pytest.skip('needs the [aot] extra: pip install -e ".[aot]"')
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    chips = targets_lib.target_devices(targets_lib.parse_target("v5e-4"))
    mesh = mesh_lib.make_mesh((1, 4, 1), devices=chips)
    U, R, P, C = 8, 4, 16, 16
    rows = mesh_lib.batch_sharding(mesh, 2)
    args = [jax.ShapeDtypeStruct((U * R, w), jnp.int32, sharding=rows) for w in (P, P, C, C)]
    cfg = ModelConfig.tiny(head_dim=128, num_heads=8, num_kv_heads=8, attention="auto")
    graphdef, state = nnx.split(nnx.eval_shape(lambda: _random_model(cfg)))
    whole = mesh_lib.replicated(mesh)
    state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=whole), state)

    def loss(state, *batch):
        return jnp.sum(shared_prompt_hidden(nnx.merge(graphdef, state), *batch, group=R))

    with target_backend("tpu"), jax.set_mesh(mesh):
        text = jax.jit(jax.grad(loss)).lower(state, *args).compile().as_text()
    assert "tpu_custom_call" in text  # the splash kernel, not the einsum path


def test_splash_reads_each_prompt_once_and_needs_fewer_temporaries_than_copies(monkeypatch):
    """The shared forward's gradient compiled for a v5e (one layer, bf16, 2 kv
    heads x 128, one prompt of 512 tokens x R = 4 rows of 256): splash runs the
    prompt's rows in one call over its K/V (`splash_prompt_rows`). The layout it
    replaced, each row in its own call over its own copy of the prompt's K/V
    (built here by repeating them), needs more temporary memory."""
    from jax.sharding import SingleDeviceSharding

    from gdpo_jax.backend import target_backend
    from gdpo_jax.models import attention as attention_lib
    from gdpo_jax.models.splash import splash_prompt_rows
    from gdpo_jax.scale import targets as targets_lib
    from tests.test_models import _random_model

    if not targets_lib.has_module("libtpu"):
        pytest.skip('needs the [aot] extra: pip install -e ".[aot]"')
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    one = SingleDeviceSharding(targets_lib.target_devices(targets_lib.parse_target("v5e-4"))[0])
    U, R, P, C = 1, 4, 512, 256
    args = [jax.ShapeDtypeStruct((U * R, w), jnp.int32, sharding=one) for w in (P, P, C, C)]
    cfg = ModelConfig.tiny(
        dtype="bfloat16", head_dim=128, num_heads=8, num_kv_heads=2, num_layers=1
    )
    graphdef, state = nnx.split(nnx.eval_shape(lambda: _random_model(cfg)))
    state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), state)

    def loss(state, *batch):
        h = shared_prompt_hidden(nnx.merge(graphdef, state), *batch, group=R)
        return jnp.sum(h.astype(jnp.float32))

    def temp_bytes() -> int:
        with target_backend("tpu"):
            compiled = jax.jit(jax.grad(loss)).lower(state, *args).compile()
        assert "tpu_custom_call" in custom_call_targets(compiled.as_text())
        return compiled.memory_analysis().temp_size_in_bytes

    def copies(q, pkt, pv, prefix_mask, kt, v, mask):  # each row its own prompt copy
        rows = functools.partial(jnp.repeat, repeats=R, axis=0)
        return splash_prompt_rows(q, rows(pkt), rows(pv), rows(prefix_mask), kt, v, mask)

    shared = temp_bytes()
    monkeypatch.setattr(attention_lib, "splash_prompt_rows", copies)
    assert shared < temp_bytes()
