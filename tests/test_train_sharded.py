"""Sharded step == unsharded step (8 fake CPU devices, several mesh shapes); one compile."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from gdpo_jax.models.sharding import create_model
from gdpo_jax.train import distributed
from gdpo_jax.train import mesh as mesh_lib
from gdpo_jax.train import state as state_lib
from gdpo_jax.train.config import base_config
from gdpo_jax.train.step import CompiledStep, StepConfig
from tests.test_train_step import CFG, NUM_GROUPS, make_batch

SC = StepConfig(
    num_groups=NUM_GROUPS,
    estimator="gdpo",
    weights=(1.0, 0.5),
    beta=0.02,
    num_microbatches=2,
    temperature=0.8,
    entropy_coef=0.01,
    kl_in_reward=0.01,  # GDPO's penalty path (added before the batch whitening)
    aggregation="dr_grpo",  # valid-row denominator (row_valid) under sharding
)


def _run(mesh, batches, sc: StepConfig = SC, ref_params=None):
    optim = base_config().optim
    optim.lr, optim.warmup_steps, optim.schedule = 1e-2, 1, "cosine"
    tx, schedule = state_lib.make_optimizer(optim, total_updates=4)
    model = create_model(CFG, mesh=mesh, seed=0)
    graphdef, state = state_lib.create_train_state(model, tx, mesh)
    step = CompiledStep(
        graphdef=graphdef,
        tx=tx,
        schedule=schedule,
        cfg=sc,
        state_shardings=state_lib.shardings_of(state),
        mesh=mesh,
    )
    metrics = []
    for b in batches:
        state, m = step(state, distributed.to_global(b, mesh), ref_params)
        metrics.append({k: float(v) for k, v in m.items()})
    return state, metrics, step


@pytest.fixture(scope="module")
def batches():
    out = [make_batch(10, with_ref=True), make_batch(11, with_ref=True)]
    out[1]["valid"][-3:] = False  # padding rows: left out of advantages and dr_grpo's count
    return out


@pytest.fixture(scope="module")
def unsharded(batches):
    state, metrics, _ = _run(None, batches)
    return jax.tree.map(np.asarray, state.params), metrics


# (8, 1, 1) explicit: 16 rows in 2 strided micro-batches of 8 = the data axis, where
# the block reshape once put the size-1 fsdp axis on the scanned dimension (an error).
@pytest.mark.parametrize(
    "shape,axis_types",
    [((2, 2, 2), "explicit"), ((1, 4, 2), "auto"), ((8, 1, 1), "explicit")],
)
def test_sharded_equals_unsharded_and_compiles_once(batches, unsharded, shape, axis_types):
    assert jax.device_count() == 8
    mesh = mesh_lib.make_mesh(shape, axis_types=axis_types)
    state, metrics, step = _run(mesh, batches)
    ref_params, ref_metrics = unsharded
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-6),
        state.params,
        ref_params,
    )
    for got, ref in zip(metrics, ref_metrics):
        assert got.keys() == ref.keys()
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=1e-6, err_msg=k)
    assert metrics[0]["lr"] == 0.0 and metrics[1]["lr"] > 0  # warmup from 0
    # Params stay where the model's rules put them (the step did not gather them).
    q = state.params["layers"]["q_proj"].get_value()
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    # Two steps with fresh data, one compilation.
    assert step.compile_count() == 1


def test_reference_forward_in_the_sharded_step_equals_unsharded(batches):
    """StepConfig.ref_logp_in_step: the reference params (placed like the
    policy's) enter the sharded step as an argument; same update as unsharded."""
    sc = dataclasses.replace(SC, kl_in_reward=0.0, old_logp_in_step=True, ref_logp_in_step=True)
    outs = []
    for mesh in (None, mesh_lib.make_mesh((2, 2, 2), axis_types="explicit")):
        ref = nnx.state(create_model(CFG, mesh=mesh, seed=5), nnx.Param)
        state, metrics, step = _run(mesh, batches, sc, ref)
        assert "ref_logp" not in step.batch_keys and step.compile_count() == 1
        outs.append((jax.tree.map(np.asarray, state.params), metrics))
    (p0, m0), (p1, m1) = outs
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p1, p0)
    for got, want in zip(m1, m0):
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)
    assert m0[0]["kl"] > 1e-3  # the reference is another model


def test_logprob_fn_sharded_matches_unsharded(batches):
    mesh = mesh_lib.make_mesh((4, 2, 1))
    outs = []
    for m in (None, mesh):
        model = create_model(CFG, mesh=m, seed=0)
        tx, sch = state_lib.make_optimizer(base_config().optim, total_updates=1)
        graphdef, state = state_lib.create_train_state(model, tx, m)
        step = CompiledStep(
            graphdef=graphdef,
            tx=tx,
            schedule=sch,
            cfg=SC,
            state_shardings=state_lib.shardings_of(state),
            mesh=m,
        )
        outs.append(np.asarray(step.logprobs(state.params, distributed.to_global(batches[0], m))))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    assert np.all(outs[0] <= 0)
