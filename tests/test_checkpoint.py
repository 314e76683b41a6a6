"""Orbax checkpoints: keep-last-N, interval, atomicity, resharding restore, config check."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from gdpo_jax.models.sharding import create_model
from gdpo_jax.train import mesh as mesh_lib
from gdpo_jax.train import state as state_lib
from gdpo_jax.train.checkpoint import Checkpointer, IncompatibleCheckpointError
from gdpo_jax.train.config import base_config
from tests.test_train_step import CFG


def _state(mesh, seed=0):
    tx, _ = state_lib.make_optimizer(base_config().optim, total_updates=10)
    _, state = state_lib.create_train_state(create_model(CFG, mesh=mesh, seed=seed), tx, mesh)
    return state


def _cfg():
    c = base_config()
    c.workdir = "/tmp/w"
    return c


def test_keep_interval_and_roundtrip(tmp_path):
    mesh = mesh_lib.make_mesh((2, 2, 2))
    state = _state(mesh)
    ck = Checkpointer(str(tmp_path), every=2, keep=2, async_save=True, config=_cfg())
    key = jax.random.key(7)
    saved = [s for s in range(1, 6) if ck.save(s, state, key=key, data_state={"next_index": s})]
    assert ck.save(5, state, key=key, data_state={"next_index": 5}, force=True)
    ck.wait()
    assert saved == [2, 4] and ck.all_steps() == [4, 5]

    # Restore onto a different layout (unsharded, one device): values unchanged.
    target = _state(None, seed=1)
    restored, rkey, data_state, step = Checkpointer(str(tmp_path), every=2, config=_cfg()).restore(
        target, jax.random.key(0)
    )
    assert step == 5 and data_state == {"next_index": 5}
    np.testing.assert_array_equal(jax.random.key_data(rkey), jax.random.key_data(key))
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), restored, state
    )
    leaf = jax.tree.leaves(restored.params)[0]
    assert len(leaf.sharding.device_set) == 1
    ck.close()


def test_interrupted_save_is_ignored(tmp_path):
    state = _state(None)
    ck = Checkpointer(str(tmp_path), every=1, async_save=False, config=_cfg())
    ck.save(1, state, key=jax.random.key(0), data_state={"next_index": 1})
    ck.close()
    # A save killed half way leaves only orbax's temporary directory behind.
    partial = tmp_path / "2.orbax-checkpoint-tmp-1234"
    (partial / "state").mkdir(parents=True)
    (partial / "state" / "garbage").write_bytes(b"\x00" * 10)
    ck2 = Checkpointer(str(tmp_path), every=1, config=_cfg())
    assert ck2.latest_step() == 1
    _, _, data_state, step = ck2.restore(state, jax.random.key(0))
    assert step == 1 and data_state == {"next_index": 1}
    ck2.close()


def test_incompatible_config_names_every_field(tmp_path):
    state = _state(None)
    ck = Checkpointer(str(tmp_path), every=1, async_save=False, config=_cfg())
    ck.save(1, state, key=jax.random.key(0))
    ck.close()
    other = _cfg()
    other.algo.estimator = "grpo"
    other.model.tiny.hidden_size = 128
    other.train.num_steps = 500  # allowed to change on resume
    with pytest.raises(IncompatibleCheckpointError) as e:
        Checkpointer(str(tmp_path), every=1, config=other).restore(state, jax.random.key(0))
    msg = str(e.value)
    assert "algo.estimator: checkpoint='gdpo' now='grpo'" in msg
    assert "model.tiny.hidden_size" in msg and "num_steps" not in msg
    assert "allow_config_change" in msg
    ok = Checkpointer(str(tmp_path), every=1, config=other, allow_config_change=True)
    assert ok.restore(state, jax.random.key(0))[3] == 1
    assert os.path.isdir(tmp_path / "1")
