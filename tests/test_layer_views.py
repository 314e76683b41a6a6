"""Unrolled layers: the step's per-layer weight views (train/layer_views.py).

With ``scan_layers=False`` the step slices the stacked layer weights once per
optimizer update, differentiates with respect to the slices, and stacks the
per-layer gradients once at the end. References: the same step under the layer
scan (which reads the stacks in place; itself checked against an unfused
reference in test_train_step.py), and the step's jaxpr for where the slicing is.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import optax
import pytest

from gdpo_jax.models.sharding import create_model
from gdpo_jax.train import distributed, layer_views
from gdpo_jax.train import state as state_lib
from gdpo_jax.train.step import StepConfig, train_step
from tests.test_train_step import CFG, NUM_GROUPS, _sgd_step, make_batch

LAYERS = 3


def _cfg(scan: bool):
    return dataclasses.replace(CFG, num_layers=LAYERS, scan_layers=scan)


def _grouped_batch(seed: int) -> dict[str, np.ndarray]:
    """make_batch with every group's rows on one prompt (for share_prompt)."""
    b = make_batch(seed, with_ref=True)
    g = len(b["prompt_ids"]) // NUM_GROUPS
    for k in ("prompt_ids", "prompt_mask"):
        b[k] = np.repeat(b[k][::g], g, axis=0)
    return b


def test_split_then_join_gives_the_params_back():
    model = create_model(_cfg(False), seed=0)
    _, state = state_lib.create_train_state(model, optax.sgd(1.0), None)
    rest, views = layer_views.split_params(state.params, LAYERS)
    assert len(views) == LAYERS and "embed" in rest and "layers" not in rest
    stacked = np.asarray(state.params["layers"]["q_proj"].get_value())
    for i in range(LAYERS):  # view i is layer i's slice
        np.testing.assert_array_equal(np.asarray(views[i]["q_proj"]), stacked[i])
    back = layer_views.join_grads(state.params, (rest, views))
    assert jax.tree.structure(back) == jax.tree.structure(state.params)
    jax.tree.map(np.testing.assert_array_equal, back, state.params)


@pytest.mark.parametrize("share", [False, True])
def test_unrolled_step_equals_the_layer_scan_step(share):
    """2 mini-batches x 2 micro-batches, beta > 0: the updated params (SGD, lr 1:
    the gradients), the loss and the reference log-prob pass agree."""
    batch = distributed.to_global(_grouped_batch(3), None)
    sc = StepConfig(
        num_groups=NUM_GROUPS,
        beta=0.04,
        num_minibatches=2,
        num_microbatches=2,
        group_size=len(batch["prompt_ids"]) // NUM_GROUPS,
        share_prompt=share,
    )
    out = {}
    for scan in (True, False):
        _, state, step = _sgd_step(sc, create_model(_cfg(scan), seed=4))
        logp = np.asarray(step.logprobs(state.params, batch))
        p0 = jax.tree.map(np.asarray, state.params)
        new, metrics = step(state, batch)
        grads = jax.tree.map(lambda a, b: a - np.asarray(b), p0, new.params)
        out[scan] = (logp, grads, float(metrics["loss"]))
    (lp_s, g_s, l_s), (lp_u, g_u, l_u) = out[True], out[False]
    np.testing.assert_allclose(lp_u, lp_s, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(l_u, l_s, rtol=1e-5, atol=1e-7)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_s), jax.tree.leaves(g_u)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-7, err_msg=jax.tree_util.keystr(path))
    # Every layer's weights moved (no layer's gradient lost in the stacking).
    moved = np.abs(g_u["layers"]["down_proj"].get_value()).reshape(LAYERS, -1).max(axis=1)
    assert (moved > 1e-6).all(), moved


def _scans(jaxpr) -> list:
    """The scan equations directly in `jaxpr` (not nested)."""
    return [e for e in jaxpr.eqns if e.primitive.name == "scan"]


def _subjaxprs(params: dict) -> list:
    vals = [v for p in params.values() for v in (p if isinstance(p, (tuple, list)) else (p,))]
    return [getattr(v, "jaxpr", v) for v in vals if hasattr(v, "eqns") or hasattr(v, "jaxpr")]


def _layer_splits(jaxpr) -> int:
    """Splits of a stacked [L, ...] array into its L layers in `jaxpr`, nested
    sub-jaxprs included."""
    n = 0
    for e in jaxpr.eqns:
        if e.primitive.name == "split" and e.params["axis"] == 0:
            n += e.invars[0].aval.shape[0] == LAYERS == len(e.params["sizes"])
        n += sum(_layer_splits(sub) for sub in _subjaxprs(e.params))
    return n


def test_the_micro_batch_loop_does_not_slice_the_layer_weights():
    """The split of the [L, ...] weights (and, transposed, the concatenation of
    their gradients) sits in the update, outside the micro-batch scan."""
    sc = StepConfig(num_groups=NUM_GROUPS, num_microbatches=2)
    model = create_model(_cfg(False), seed=0)
    tx = optax.sgd(1.0)
    graphdef, state = state_lib.create_train_state(model, tx, None)
    fn = functools.partial(
        train_step, graphdef=graphdef, tx=tx, schedule=optax.constant_schedule(1.0), cfg=sc
    )
    batch = distributed.to_global(make_batch(0), None)
    top = jax.make_jaxpr(fn)(state, batch).jaxpr
    (epoch,) = _scans(top)
    (update,) = _scans(epoch.params["jaxpr"].jaxpr)
    update_body = update.params["jaxpr"].jaxpr
    (micro,) = _scans(update_body)
    assert _layer_splits(micro.params["jaxpr"].jaxpr) == 0
    assert _layer_splits(update_body) >= 9  # each of the layer weights


@pytest.mark.parametrize("axis_types", ["explicit", "auto"])
def test_unrolled_step_on_a_mesh_equals_the_unsharded_scan_step(axis_types):
    """Views of fsdp/tensor-sharded weights (2x2x2 mesh): the update equals the
    unsharded layer-scan step's, and the params keep their sharding."""
    from gdpo_jax.train import mesh as mesh_lib

    batch = make_batch(5, with_ref=True)
    sc = StepConfig(num_groups=NUM_GROUPS, beta=0.04, num_microbatches=2)
    out = []
    for scan, mesh in ((True, None), (False, mesh_lib.make_mesh((2, 2, 2), axis_types=axis_types))):
        _, state, step = _sgd_step(sc, create_model(_cfg(scan), mesh=mesh, seed=6), mesh)
        new, _ = step(state, distributed.to_global(batch, mesh))
        out.append(new.params)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6),
        out[0],
        out[1],
    )
    q = out[1]["layers"]["q_proj"].get_value()
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
