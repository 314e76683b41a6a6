"""The resume checks: before a run resumes, its newest readable checkpoint must have
been written with the same config (in the fields a resume keeps) and over the same
training records. Both read the run directory through a read-only `Checkpointer`
(no tmp-dir clean-up: a live run's save may be in progress) and stop in one line
(`ConfigError`) before any work: the CLI calls `check_resume_config` before it writes
config.json, `Trainer` and `SFT` call `check_resume_data` before the model build.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import ml_collections as mlc

from gdpo_jax.train import config as config_lib
from gdpo_jax.train import paths
from gdpo_jax.train.checkpoint_errors import (
    CheckpointUnavailableError,
    IncompatibleCheckpointError,
    short_error,
    unreadable_now,
)

if TYPE_CHECKING:
    from gdpo_jax.train.checkpoint import Checkpointer

__all__ = ["check_resume_config", "check_resume_data"]

log = logging.getLogger("gdpo_jax.train")


def _existing_checkpointer(cfg: mlc.ConfigDict) -> Checkpointer | None:
    """A read-only checkpointer of the run directory when `<workdir>/checkpoints` exists
    (None otherwise: nothing is created, and nothing removed)."""
    if not paths.exists(paths.join(cfg.workdir.rstrip("/"), "checkpoints")):
        return None
    # Here, not at the top: the train CLI imports this module before its config checks,
    # and the checkpointer's imports (orbax, the train state) would slow every refusal
    # of a bad config (benchmarks/profile_import.py times one; tests/test_config.py
    # checks what a refusal imports).
    from gdpo_jax.train.checkpoint import Checkpointer

    return Checkpointer.from_config(cfg, read_only=True)


def _newest_meta(ckpt: Checkpointer) -> dict | None:
    """The meta of the newest checkpoint whose meta reads; None when there is none
    (damaged steps are the restore's to report).

    Raises CheckpointUnavailableError when a read fails for the storage's sake (EIO, a
    timeout, permissions: `checkpoint_errors.unreadable_now`): checking an older step then
    would check what the restore will not resume from, and each process of a run could
    check a different step.
    """
    for step in sorted(ckpt.all_steps(), reverse=True):
        try:
            return ckpt.read_meta(step)
        except Exception as e:  # noqa: BLE001 - damaged: the restore falls back past it
            now = unreadable_now(e)
            if now is not None:
                raise CheckpointUnavailableError(
                    f"cannot read checkpoint step {step} at {ckpt.directory} now to check "
                    f"the resume ({short_error(now)}); it may be intact. Check the storage, "
                    "then rerun to resume."
                ) from None
    return None


def check_resume_data(cfg: mlc.ConfigDict, fingerprint: str, num_records: int) -> None:
    """Raises ConfigError (one line) when the newest readable checkpoint was trained on
    other training records than `fingerprint` / `num_records` (data.stream's
    `records_fingerprint` of the task's training records, before the length filter).

    The checkpoint keeps the stream's position, and the order it indexes is a function
    of the records: a changed data file under the same config would resume into another
    sequence of prompts without a word. `checkpoint.allow_config_change=True` resumes
    anyway, with a warning. Checkpoints written before the fingerprint: not checked.
    """
    ckpt = _existing_checkpointer(cfg)
    if ckpt is None:
        return
    try:
        meta = _newest_meta(ckpt)
    finally:
        ckpt.close()
    saved = ((meta or {}).get("data_state") or {}).get("records")
    if not saved or saved.get("fingerprint") == fingerprint:
        return
    what = (
        f"the training records differ from those the checkpoints in {cfg.workdir} were "
        f"trained on ({saved.get('count')} records, fingerprint {saved.get('fingerprint')}; "
        f"now {num_records}, {fingerprint})"
    )
    if cfg.checkpoint.allow_config_change:
        log.warning("%s; resuming anyway (checkpoint.allow_config_change=True)", what)
        return
    raise config_lib.ConfigError(
        f"config.task.source={cfg.task.source!r}: {what}, so the resumed run would not see "
        "the prompts it would have seen. Resume with the same data, start a new "
        "config.workdir, or pass --config.checkpoint.allow_config_change=True."
    )


def check_resume_config(cfg: mlc.ConfigDict) -> None:
    """Raises ConfigError (one line) when the run directory's newest readable checkpoint
    was written with a config that differs in fields a resume must keep.

    The CLI calls it before writing `<workdir>/config.json`, so a rejected config
    neither starts work nor replaces the record of the one the checkpoints hold.
    No checkpoint, or none whose meta reads: nothing to check (the restore itself
    reports damaged steps).
    """
    ckpt = _existing_checkpointer(cfg)
    if ckpt is None:
        return
    try:
        meta = _newest_meta(ckpt)
        if meta is not None:
            ckpt.check_config(meta)
    except IncompatibleCheckpointError as e:
        lines = str(e).splitlines()
        fields = "; ".join(line.strip() for line in lines[1:-1])
        raise config_lib.ConfigError(f"{lines[0].rstrip(':')}: {fields}. {lines[-1]}") from None
    finally:
        ckpt.close()
