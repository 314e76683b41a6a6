"""Orbax checkpoints: keep-last-N, interval, atomicity, resharding restore, config check."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from unittest import mock

import jax
import numpy as np
import pytest

from gdpo_jax.models.sharding import create_model
from gdpo_jax.train import checkpoint as checkpoint_lib
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


@pytest.fixture(autouse=True)
def _no_pause_before_second_read(monkeypatch):
    monkeypatch.setattr(checkpoint_lib, "_RETRY_PAUSE_S", 0.0)


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


def test_a_checkpoint_with_the_key_as_an_array_item_still_restores(tmp_path):
    """Checkpoints written before 2026-12-05 hold the PRNG key as an array item of
    "state" (which orbax refuses to write with several processes: the key is
    host-local); today's keep its words in the JSON meta. Both restore the key."""
    import orbax.checkpoint as ocp

    state, key = _state(None), jax.random.key(11)
    ck = Checkpointer(str(tmp_path / "new"), every=1, async_save=False, config=_cfg())
    assert ck.save(1, state, key=key, data_state={"next_index": 1})
    ck.close()
    meta = Checkpointer(str(tmp_path / "new"), every=1, config=_cfg()).read_meta()
    assert meta["key_data"] == np.asarray(jax.random.key_data(key)).tolist()
    # The old layout, written as the Checkpointer used to.
    old_meta = {k: v for k, v in meta.items() if k != "key_data"}
    with ocp.CheckpointManager(str(tmp_path / "old")) as mngr:
        items = {"train_state": state, "key": jax.random.key_data(key)}
        mngr.save(
            1,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(items), meta=ocp.args.JsonSave(old_meta)
            ),
        )
    for where in ("new", "old"):
        ck = Checkpointer(str(tmp_path / where), every=1, config=_cfg())
        restored, rkey, data_state, step = ck.restore(_state(None, seed=1), jax.random.key(0))
        assert step == 1 and data_state == {"next_index": 1}, where
        np.testing.assert_array_equal(jax.random.key_data(rkey), jax.random.key_data(key))
        assert jax.random.key_data(rkey).dtype == jax.random.key_data(key).dtype
        jax.tree.map(
            lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
            restored,
            state,
        )
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

    # allow_config_change with a state of other shapes (here a wider model): the config's
    # doing, not damage. It was reported as a damaged checkpoint, with advice to remove
    # the run's (intact) steps.
    import dataclasses

    wider = dataclasses.replace(CFG, hidden_size=64)
    tx, _ = state_lib.make_optimizer(base_config().optim, total_updates=10)
    _, other_state = state_lib.create_train_state(create_model(wider, mesh=None), tx, None)
    with pytest.raises(IncompatibleCheckpointError) as e:
        ok.restore(other_state, jax.random.key(0))
    msg = str(e.value)
    assert "does not fit this run's state" in msg and "model.tiny.hidden_size" in msg
    assert "damaged" not in msg.lower()
    assert os.path.isdir(tmp_path / "1") and not os.path.exists(str(tmp_path) + "-damaged")


def _damage(step_dir, kind: str) -> str:
    """Truncates the biggest array data file ("array") or the metadata JSON ("meta"),
    or deletes the metadata JSON ("missing": a FileNotFoundError, still damage)."""
    import glob

    if kind == "array":
        files = glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True)
        path = max(files, key=os.path.getsize)
    else:
        path = os.path.join(step_dir, "meta", "metadata")
    if kind == "missing":
        os.remove(path)
        return path
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    return path


@pytest.mark.parametrize("kind", ["array", "meta", "missing"])
def test_damaged_latest_falls_back_to_previous_with_warning(tmp_path, kind, caplog):
    # Different weights at each step, restored onto a third: step 1's must come back
    # from disk (the same state everywhere would pass with the target handed back).
    state = _state(None)
    ck = Checkpointer(str(tmp_path), every=1, keep=3, async_save=False, config=_cfg())
    for s in (1, 2):
        saved = state if s == 1 else _state(None, seed=2)
        ck.save(s, saved, key=jax.random.key(s), data_state={"next_index": s})
    ck.close()
    _damage(str(tmp_path / "2"), kind)
    ck2 = Checkpointer(str(tmp_path), every=1, keep=3, config=_cfg())
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.train"):
        restored, rkey, data_state, step = ck2.restore(_state(None, seed=3), jax.random.key(0))
    assert step == 1 and data_state == {"next_index": 1}
    np.testing.assert_array_equal(jax.random.key_data(rkey), jax.random.key_data(jax.random.key(1)))
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), restored, state
    )
    msg = caplog.text
    assert f"checkpoint step 2 at {tmp_path / '2'} is damaged" in msg
    assert "falling back to step 1" in msg and "TensorStore details" not in msg
    # The damaged step is moved aside (not deleted), so the resumed run re-saves step 2.
    assert ck2.all_steps() == [1] and os.path.isdir(str(tmp_path) + "-damaged/2")
    assert ck2.save(2, state, key=jax.random.key(2), data_state={"next_index": 2})
    ck2.close()
    ck3 = Checkpointer(str(tmp_path), every=1, config=_cfg())
    assert ck3.restore(state, jax.random.key(0))[3] == 2
    ck3.close()
    # Damaged again: it goes beside the first copy (which was deleted to make room).
    _damage(str(tmp_path / "2"), kind)
    ck4 = Checkpointer(str(tmp_path), every=1, config=_cfg())
    assert ck4.restore(state, jax.random.key(0))[3] == 1
    ck4.close()
    assert sorted(os.listdir(str(tmp_path) + "-damaged")) == ["2", "2.1"]


@pytest.mark.parametrize("kind", ["array", "meta"])
def test_only_checkpoint_damaged_fails_loudly(tmp_path, kind):
    from gdpo_jax.train.checkpoint import DamagedCheckpointError

    state = _state(None)
    ck = Checkpointer(str(tmp_path), every=1, keep=1, async_save=False, config=_cfg())
    ck.save(1, state, key=jax.random.key(0))
    ck.close()
    _damage(str(tmp_path / "1"), kind)
    with pytest.raises(
        DamagedCheckpointError, match=rf"step 1 at {tmp_path}/1: .*Refusing to restart from step 0"
    ):
        Checkpointer(str(tmp_path), every=1, keep=1, config=_cfg()).restore(
            state, jax.random.key(0)
        )
    assert os.listdir(tmp_path) == ["1"]  # nothing moved or deleted


# --- A read that fails for the storage's or the process's sake is not damage.
@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A checkpoint directory holding steps 1 and 2 (different weights), and their states."""
    directory = str(tmp_path_factory.mktemp("two_steps") / "checkpoints")
    states = {s: _state(None, seed=s) for s in (1, 2)}
    ck = Checkpointer(directory, every=1, keep=3, async_save=False, config=_cfg())
    for s, st in states.items():
        ck.save(s, st, key=jax.random.key(s), data_state={"next_index": s})
    ck.close()
    return directory, states


def _copy_steps(two_steps, tmp_path) -> str:
    directory = str(tmp_path / "checkpoints")
    shutil.copytree(two_steps[0], directory)
    return directory


def _nothing_moved(tmp_path, directory) -> bool:
    return os.listdir(tmp_path) == ["checkpoints"] and sorted(os.listdir(directory)) == ["1", "2"]


def _failing_reads(monkeypatch, step: int, error, times: int = 1_000) -> list[int]:
    """The next `times` array reads of `step` raise `error()`, where orbax's own would."""
    import orbax.checkpoint as ocp

    real = ocp.CheckpointManager.restore
    raised: list[int] = []

    def restore(self, s, *args, **kwargs):
        if s == step and "state" in kwargs.get("args", {}) and len(raised) < times:
            raised.append(s)
            raise error()
        return real(self, s, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "restore", restore)
    return raised


def _tensorstore(text: str):
    """orbax's wrapper around a TensorStore read error (the chain restore raises)."""

    def make():
        e = Exception("Encountered error while reading array index: (slice(0, 64, 1),).")
        e.__cause__ = ValueError(text)
        return e

    return make


_TS_EIO = (
    'UNKNOWN: Error reading "train_state.params.embed.value/0.0" in OCDBT database at local '
    'file "/n/ckpt/2/state/": Failed to open: "/n/ckpt/2/state/d/5ca9": Input/output error '
    "[os_error_code='5']"
)
_TS_ENOTCONN = (  # a FUSE mount gone: FAILED_PRECONDITION, as a truncated file is
    'FAILED_PRECONDITION: Error reading "train_state.step/0" in OCDBT database at local file '
    '"/n/ckpt/2/state/": Transport endpoint is not connected [OS error 107: ENOTCONN]'
)
_GCS_503 = (
    'UNAVAILABLE: Error reading "manifest.ocdbt" in OCDBT database at '
    '"gs://bucket/run/checkpoints/2/state/": HTTP response code: 503'
)
_TS_SHORT_READ = (
    'OUT_OF_RANGE: Error reading "train_state.step/0" in OCDBT database at local file '
    '"/n/ckpt/2/state/": Requested byte range [0, 900) is not valid for value of size 0'
)


@pytest.mark.parametrize(
    "error",
    [lambda: OSError(errno.EIO, "Input/output error"), _tensorstore(_TS_SHORT_READ)],
    ids=["eio", "short_read_like_a_truncated_file"],
)
def test_read_failing_once_is_read_again_and_nothing_moved(
    two_steps, tmp_path, monkeypatch, caplog, error
):
    directory = _copy_steps(two_steps, tmp_path)
    states = two_steps[1]
    raised = _failing_reads(monkeypatch, 2, error, times=1)
    ck = Checkpointer(directory, every=1, config=_cfg())
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.train"):
        restored, _, data_state, step = ck.restore(states[1], jax.random.key(0))
    ck.close()
    assert raised == [2] and step == 2 and data_state == {"next_index": 2}
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
        restored,
        states[2],
    )
    assert f"checkpoint step 2 at {directory}/2 failed to read once" in caplog.text
    assert "damaged" not in caplog.text and _nothing_moved(tmp_path, directory)


@pytest.mark.parametrize(
    "error",
    [
        lambda: OSError(errno.EIO, "Input/output error"),
        lambda: TimeoutError(errno.ETIMEDOUT, "Connection timed out"),
        lambda: OSError(errno.ENOSPC, "No space left on device"),
        lambda: PermissionError(errno.EACCES, "Permission denied"),
        MemoryError,
        lambda: jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating"),
        _tensorstore(_TS_EIO),
        _tensorstore(_TS_ENOTCONN),
        _tensorstore(_GCS_503),
    ],
    ids=[
        "eio",
        "etimedout",
        "enospc",
        "permission",
        "memory",
        "jax_runtime",
        "tensorstore_eio",
        "tensorstore_enotconn",
        "gcs_503",
    ],
)
def test_storage_error_stops_the_restore_and_moves_nothing(two_steps, tmp_path, monkeypatch, error):
    directory = _copy_steps(two_steps, tmp_path)
    raised = _failing_reads(monkeypatch, 2, error)
    ck = Checkpointer(directory, every=1, config=_cfg())
    with pytest.raises(checkpoint_lib.CheckpointUnavailableError) as e:
        ck.restore(two_steps[1][1], jax.random.key(0))
    ck.close()
    msg = str(e.value)
    assert msg.startswith(f"cannot read checkpoint step 2 at {directory}/2 now (")
    assert "nothing was moved" in msg and "\n" not in msg, msg
    assert raised == [2, 2] and _nothing_moved(tmp_path, directory)  # read twice, step 1 never


def test_older_step_unreadable_now_moves_not_even_the_damaged_newer_one(
    two_steps, tmp_path, monkeypatch
):
    directory = _copy_steps(two_steps, tmp_path)
    _damage(os.path.join(directory, "2"), "array")
    _failing_reads(monkeypatch, 1, lambda: PermissionError(errno.EACCES, "Permission denied"))
    with pytest.raises(
        checkpoint_lib.CheckpointUnavailableError,
        match=rf"cannot read checkpoint step 1 at {directory}/1 now \(PermissionError",
    ):
        Checkpointer(directory, every=1, config=_cfg()).restore(two_steps[1][1], jax.random.key(0))
    assert _nothing_moved(tmp_path, directory)


def test_interrupted_restore_moves_nothing(two_steps, tmp_path, monkeypatch):
    directory = _copy_steps(two_steps, tmp_path)
    raised = _failing_reads(monkeypatch, 2, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        Checkpointer(directory, every=1, config=_cfg()).restore(two_steps[1][1], jax.random.key(0))
    assert raised == [2] and _nothing_moved(tmp_path, directory)


_FAILED_RESTORES = r"""
import gc, logging, sys, time
import jax
from tests.test_checkpoint import _cfg, _damage, _state
from gdpo_jax.train.checkpoint import Checkpointer, DamagedCheckpointError

logging.basicConfig(level=logging.WARNING)
directory, restores = sys.argv[1], int(sys.argv[2])
state = _state(None)
ck = Checkpointer(directory, every=1, keep=1, async_save=False, config=_cfg())
ck.save(1, state, key=jax.random.key(0))
ck.close()
_damage(directory + "/1", "array")
for _ in range(restores):
    try:
        Checkpointer(directory, every=1, keep=1, config=_cfg()).restore(state, jax.random.key(0))
    except DamagedCheckpointError:
        print("damaged", flush=True)
time.sleep(0.5)  # TensorStore's callbacks land after the restore has returned
gc.collect()


class Unrelated:
    def __del__(self):
        raise ValueError("an unrelated unraisable error")


Unrelated()
"""


def test_failed_restore_reports_one_error_not_orbax_abandoned_reads(tmp_path):
    # orbax leaves a failed restore's other reads in flight; without
    # orbax_noise.quiet_abandoned_reads each restore printed dozens of "Exception
    # ignored in: <coroutine _read_array_index_and_device_put>" / "Event loop
    # is closed" tracebacks and "Task exception was never retrieved" records.
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": root}
    proc = subprocess.run(
        [sys.executable, "-c", _FAILED_RESTORES, str(tmp_path), "5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["damaged"] * 5
    err = proc.stderr
    assert "Exception ignored in: <coroutine" not in err, err[-3000:]
    assert "exception was never retrieved" not in err, err[-3000:]
    # Each restore's one warning names the error; no other line repeats it.
    reads = [ln for ln in err.splitlines() if "Encountered error while reading" in ln]
    assert len(reads) == 5 and all(ln.startswith("WARNING:gdpo_jax.train:") for ln in reads)
    assert "ValueError: an unrelated unraisable error" in err  # other errors still print


@pytest.mark.parametrize("other", ["damaged", "unavailable"])
def test_processes_agree_on_the_step_they_restore(two_steps, tmp_path, monkeypatch, other):
    # Each process judged its own read: one that met damage in step 2 fell back to step 1
    # (or stopped) while the others resumed from step 2. This process reads step 2 fine;
    # another process's verdict on it (through _agree, an allgather) is the worse one.
    directory = _copy_steps(two_steps, tmp_path)
    worse = {"damaged": checkpoint_lib._DAMAGED, "unavailable": checkpoint_lib._UNAVAILABLE}
    seen = []

    def agree(verdict):
        seen.append(verdict)
        return max(verdict, worse[other]) if len(seen) == 1 else verdict  # step 2 only

    monkeypatch.setattr(checkpoint_lib, "_agree", agree)
    ck = Checkpointer(directory, every=1, keep=3, config=_cfg())
    if other == "unavailable":
        with pytest.raises(
            checkpoint_lib.CheckpointUnavailableError,
            match=r"another process cannot read checkpoint step 2 .* nothing was moved",
        ):
            ck.restore(two_steps[1][1], jax.random.key(0))
        assert seen == [checkpoint_lib._READ] and _nothing_moved(tmp_path, directory)
        return
    restored, _, data_state, step = ck.restore(two_steps[1][2], jax.random.key(0))
    assert step == 1 and data_state == {"next_index": 1}
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
        restored,
        two_steps[1][1],
    )
    assert seen == [checkpoint_lib._READ, checkpoint_lib._READ]
    assert ck.all_steps() == [1] and os.path.isdir(directory + "-damaged/2")
    ck.close()


@pytest.mark.parametrize("process", [0, 1])
def test_a_failed_move_aside_stops_every_process_in_one_line(
    two_steps, tmp_path, monkeypatch, process
):
    # Process 0 moves the damaged steps; when that failed it raised alone, a traceback
    # from shutil, while every other process waited at the next barrier for ever.
    from gdpo_jax import multihost
    from gdpo_jax.train import paths

    directory = _copy_steps(two_steps, tmp_path)
    seen = []

    def agree(verdict):  # step 2 is damaged on some process
        seen.append(verdict)
        return checkpoint_lib._DAMAGED if len(seen) == 1 else verdict

    def refused(src, dst):
        raise PermissionError(13, "Permission denied", dst)

    monkeypatch.setattr(checkpoint_lib, "_agree", agree)
    monkeypatch.setattr(paths, "move", refused)
    if process:  # a second process: process 0's failure reaches it through the allgather
        move_aside = Checkpointer._move_aside

        def as_process_1(self, steps):
            with (
                mock.patch.object(jax, "process_count", lambda: 2),
                mock.patch.object(jax, "process_index", lambda: 1),
            ):
                return move_aside(self, steps)

        monkeypatch.setattr(Checkpointer, "_move_aside", as_process_1)
        monkeypatch.setattr(multihost, "allgather", lambda x: np.array([False, bool(x)]))
    ck = Checkpointer(directory, every=1, keep=3, config=_cfg())
    with pytest.raises(checkpoint_lib.CheckpointUnavailableError) as e:
        ck.restore(two_steps[1][2], jax.random.key(0))
    msg = str(e.value)
    assert "\n" not in msg and "could not move the damaged steps [2]" in msg
    assert ("Permission denied" if process == 0 else "on process 0") in msg
    assert "by hand" in msg and os.path.isdir(os.path.join(directory, "2"))


@pytest.mark.parametrize("driver", ["rl", "sft"])
def test_a_failed_final_save_still_closes_the_metrics_and_the_reward_pool(
    tmp_path, monkeypatch, driver
):
    # A failed final async save raises from Checkpointer.close(); the closes after it
    # were skipped: TensorBoard's buffer never reached disk and the reward pool kept
    # running. The loops run here on fakes: the closing order is what is tested.
    from types import SimpleNamespace

    from gdpo_jax.train import metrics as metrics_lib
    from gdpo_jax.train.loop import Trainer
    from gdpo_jax.train.sft import SFT, sft_config

    closed = []
    real_close = metrics_lib.MetricsWriter.close

    def writer_close(self):
        closed.append("writer")
        real_close(self)

    monkeypatch.setattr(metrics_lib.MetricsWriter, "close", writer_close)

    class FailingCkpt:
        def save(self, *args, **kwargs) -> bool:
            return False

        def close(self) -> None:
            closed.append("ckpt")
            raise RuntimeError("the final save failed")

    cfg = sft_config()
    cfg.workdir = str(tmp_path)
    cfg.train.update(num_steps=1, tensorboard=False, progress_bar=False)
    cfg.sft.update(num_steps=1, evaluate=False)
    run = object.__new__(Trainer if driver == "rl" else SFT)
    run.cfg, run.start_step, run.ckpt, run.state, run.key, run.records = (
        cfg,
        0,
        FailingCkpt(),
        None,
        None,
        {},
    )
    if driver == "rl":
        run.train_step = lambda step: {"loss": 0.5}
        run.stream = SimpleNamespace(get_state=dict)
        run.runner = SimpleNamespace(close=lambda: closed.append("runner"))
    else:
        run.step = lambda step: {"loss": 0.5}
    with pytest.raises(RuntimeError, match="the final save failed"):
        run.run()
    assert closed == (["ckpt", "writer", "runner"] if driver == "rl" else ["ckpt", "writer"])
    assert '"loss": 0.5' in (tmp_path / "metrics.jsonl").read_text()


def test_a_never_started_read_coroutines_warning_is_dropped_and_no_other(monkeypatch):
    """A failed restore's abandoned read that never started warns through `warnings`
    ("coroutine ... was never awaited", seen in CI logs), not the unraisable hook the
    other reports use; quiet_abandoned_reads drops that one warning only."""
    import sys
    import warnings

    from gdpo_jax.train import orbax_noise

    monkeypatch.setattr(orbax_noise, "_installed", False)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        orbax_noise.quiet_abandoned_reads()
        warnings.warn(
            "coroutine '_read_array_index_and_device_put' was never awaited",
            RuntimeWarning,
            stacklevel=1,
        )
        warnings.warn("coroutine 'train_one_step' was never awaited", RuntimeWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["coroutine 'train_one_step' was never awaited"]
