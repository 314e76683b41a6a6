"""A resume over other training records than the checkpoint's stops in one line.

The checkpoint keeps the prompt stream's position; the order it indexes is a function
of the records and the seed. A data file changed between a kill and the resume, under
the same config, used to resume into another sequence of prompts without a word.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from gdpo_jax.data.stream import records_fingerprint
from gdpo_jax.tasks import TaskData
from gdpo_jax.train import build
from gdpo_jax.train.checkpoint import Checkpointer
from gdpo_jax.train.config import ConfigError
from gdpo_jax.train.loop import Trainer
from gdpo_jax.train.resume_checks import check_resume_data
from tests._train_fixtures import tiny_config


def _records(n: int, changed: int | None = None) -> list[dict]:
    return [{"prompt": [7, 8 + (i == changed), 9], "id": i} for i in range(n)]


def test_fingerprint_follows_content_and_order_only():
    a = [{"prompt": "p", "x": np.arange(3)}, {"prompt": "q", "y": 1}]
    same = [{"x": np.arange(3), "prompt": "p"}, {"y": 1, "prompt": "q"}]  # key order
    assert records_fingerprint(a) == records_fingerprint(same)
    assert len(records_fingerprint(a)) == 16
    assert records_fingerprint(a) != records_fingerprint(a[::-1])
    assert records_fingerprint(a) != records_fingerprint([a[0], {"prompt": "q", "y": 2}])
    assert records_fingerprint(a) != records_fingerprint(a[:1])
    assert records_fingerprint(a) != records_fingerprint([{"prompt": "p", "x": np.arange(4)}, a[1]])


def test_check_resume_data_against_a_checkpoint(tmp_path, caplog):
    cfg = tiny_config(str(tmp_path / "run"))
    check_resume_data(cfg, "f" * 16, 3)  # no checkpoint: nothing to check
    ckpt = Checkpointer.from_config(cfg)
    state = {"w": np.zeros(2, np.float32)}
    records = {"fingerprint": "a" * 16, "count": 3}
    ckpt.save(1, state, key=jax.random.key(0), data_state={"next_index": 4}, force=True)
    ckpt.wait()
    check_resume_data(cfg, "f" * 16, 3)  # written before the fingerprint: not checked
    ckpt.save(
        2,
        state,
        key=jax.random.key(0),
        data_state={"next_index": 8, "records": records},
        force=True,
    )
    ckpt.close()
    check_resume_data(cfg, "a" * 16, 3)
    with pytest.raises(ConfigError) as e:
        check_resume_data(cfg, "b" * 16, 4)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config.task.source=")
    assert f"(3 records, fingerprint {'a' * 16}; now 4, {'b' * 16})" in msg
    assert "--config.checkpoint.allow_config_change=True" in msg
    cfg.checkpoint.allow_config_change = True  # the user says so: a warning
    check_resume_data(cfg, "b" * 16, 4)
    assert "resuming anyway" in caplog.text


def test_trainer_stops_before_the_model_build_when_the_records_changed(tmp_path, monkeypatch):
    cfg = tiny_config(str(tmp_path))
    cfg.train.num_steps, cfg.checkpoint.every = 1, 1
    task = TaskData(train=_records(8), eval=[], evaluate=None)
    Trainer(cfg, task=task).run()  # its checkpoint holds the records' fingerprint
    meta = Checkpointer.from_config(cfg).read_meta()
    assert meta["data_state"]["records"] == {
        "fingerprint": records_fingerprint(task.train),
        "count": 8,
    }

    def no_build(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(build, "build_model", no_build)
    changed = TaskData(train=_records(8, changed=5), eval=[], evaluate=None)
    with pytest.raises(ConfigError, match=r"training records differ .* \(8 records, fingerprint"):
        Trainer(cfg, task=changed)
    monkeypatch.undo()
    cfg.train.num_steps = 2  # the same records resume
    assert Trainer(cfg, task=task).start_step == 1


def test_the_resume_checks_leave_a_save_in_progress_alone(tmp_path):
    # The checks opened a writing checkpointer, whose clean-up of tmp dirs (in a background
    # thread, from its constructor) removed the tmp dir of a save in progress: a CI run
    # failed in the save after `check_resume_data` (FileNotFoundError on
    # `2.orbax-checkpoint-tmp/meta.orbax-checkpoint-tmp/metadata`), and a run's save would
    # fail the same way while its directory is checked, or read, from another process.
    import time

    from gdpo_jax.train.resume_checks import check_resume_config

    cfg = tiny_config(str(tmp_path / "run"))
    ckpt = Checkpointer.from_config(cfg)
    ckpt.save(1, {"w": np.zeros(2, np.float32)}, key=jax.random.key(0), force=True)
    ckpt.close()
    live = tmp_path / "run" / "checkpoints" / "2.orbax-checkpoint-tmp"
    (live / "meta.orbax-checkpoint-tmp").mkdir(parents=True)  # as a save in progress has it
    check_resume_data(cfg, "f" * 16, 3)
    check_resume_config(cfg)
    time.sleep(1.0)  # a background clean-up, were one started, has run by now
    assert live.is_dir()
    reader = Checkpointer.from_config(cfg, read_only=True)
    with pytest.raises(RuntimeError, match="read-only"):
        reader.save(3, {"w": np.zeros(2, np.float32)}, key=jax.random.key(0), force=True)
    reader.close()
    # A run's own writer still removes a tmp dir that its directory holds when it opens
    # (a killed save's), before it saves.
    Checkpointer.from_config(cfg).close()
    deadline = time.monotonic() + 10
    while live.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live.exists()


def test_a_meta_unreadable_now_stops_the_resume_check_and_damage_falls_back(tmp_path, monkeypatch):
    # A transient read error (EIO) on the newest step's meta was taken for damage: the
    # check went on to an older step, not the one the restore resumes from (and each
    # process of a run could check another step).
    import errno
    import json

    from gdpo_jax.train.checkpoint import CheckpointUnavailableError

    cfg = tiny_config(str(tmp_path / "run"))
    ckpt = Checkpointer.from_config(cfg)
    state = {"w": np.zeros(2, np.float32)}
    for step, fp in ((1, "a" * 16), (2, "b" * 16)):
        records = {"fingerprint": fp, "count": 3}
        ckpt.save(step, state, key=jax.random.key(0), data_state={"records": records}, force=True)
    ckpt.close()
    real = Checkpointer.read_meta

    def failing(error):
        def read_meta(self, step=None):
            if step == 2:
                raise error
            return real(self, step)

        return read_meta

    monkeypatch.setattr(Checkpointer, "read_meta", failing(OSError(errno.EIO, "I/O error")))
    with pytest.raises(CheckpointUnavailableError, match=r"cannot read checkpoint step 2 at"):
        check_resume_data(cfg, "a" * 16, 3)
    # Damage (bad bytes) is the restore's to report: the check falls back past it.
    bad = json.JSONDecodeError("Expecting value", "", 0)
    monkeypatch.setattr(Checkpointer, "read_meta", failing(bad))
    check_resume_data(cfg, "a" * 16, 3)  # step 1's records
    with pytest.raises(ConfigError):
        check_resume_data(cfg, "b" * 16, 3)
