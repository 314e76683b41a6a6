"""Orbax checkpoints of a run: train state + PRNG key + data iterator + config.

Layout: `<workdir>/checkpoints/<step>/{state,meta}`. "state" is the
TrainState pytree (params, optimizer state, step), saved sharded (each host
writes its shards; restore places each array straight onto its target
sharding). "meta" is JSON: the data iterator state, the loop's PRNG key words
(`key_data`; checkpoints written before 2026-12-05 hold the key in "state"),
the full config and its fingerprint.

Orbax writes each checkpoint into a temporary directory and renames it when
complete, so a run killed during a save resumes from the previous complete
checkpoint; saves are asynchronous (the step loop continues while the files
are written) unless `async_save=False`.

A complete but damaged checkpoint (a truncated or missing array file, unreadable
metadata) fails to restore, twice: the latest step that restores is used
instead, with a warning naming each damaged step and path, and the damaged newer
steps are moved to `<workdir>/checkpoints-damaged/<step>` so the resumed run
writes them afresh. When no kept step restores, `DamagedCheckpointError` stops
the run: it never restarts from step 0 over the existing checkpoints. A read that
fails because of the storage or the process, not the bytes (an I/O or permission
error, a full disk, a network store's timeout, host memory), is not damage:
`CheckpointUnavailableError` stops the run and nothing is moved
(`checkpoint_errors.unreadable_now`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import jax
import ml_collections as mlc
import numpy as np
import orbax.checkpoint as ocp

from gdpo_jax.train import config as config_lib
from gdpo_jax.train import paths
from gdpo_jax.train.checkpoint_errors import (
    CheckpointUnavailableError,
    DamagedCheckpointError,
    IncompatibleCheckpointError,
    short_error,
    unreadable_now,
)
from gdpo_jax.train.orbax_noise import quiet_abandoned_reads
from gdpo_jax.train.state import abstract_of

log = logging.getLogger("gdpo_jax.train")


_RETRY_PAUSE_S = 1.0  # before the second read of a step that failed once


class Checkpointer:
    """Keep-last-N, every-k-steps checkpointing of one run directory.

    Args:
      directory: where checkpoints live (created).
      every: save interval in steps (0: only on `save(..., force=True)`).
      keep: how many recent checkpoints to keep.
      async_save: write in a background thread.
      config: the run's config; saved with each checkpoint and compared on restore.
      read_only: only read (the resume checks): no save, and no clean-up of tmp
        dirs, which would remove a live run's save in progress.
    """

    def __init__(
        self,
        directory: str,
        *,
        every: int,
        keep: int = 3,
        async_save: bool = True,
        config: mlc.ConfigDict | None = None,
        allow_config_change: bool = False,
        read_only: bool = False,
    ):
        # A URL (gs://...) goes to Orbax as is: abspath would make it ./gs:/...
        self.directory = directory if "://" in directory else os.path.abspath(directory)
        self.every = int(every)
        self.config = config
        self.allow_config_change = allow_config_change
        self.read_only = read_only
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max(int(keep), 1),
            save_interval_steps=max(self.every, 1),
            enable_async_checkpointing=async_save,
            create=not read_only,
            # A tmp dir left by a killed save is ignored by restore and removed here, by
            # a writer only: a reader's clean-up (in a background thread) could remove a
            # live run's save in progress. (Orbax's own read_only option warns on every
            # open; `save` refuses instead.)
            cleanup_tmp_directories=not read_only,
        )
        self._mngr = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "meta")
        )

    @classmethod
    def from_config(cls, cfg: mlc.ConfigDict, *, read_only: bool = False) -> Checkpointer:
        """The run's checkpointer: `<cfg.workdir>/checkpoints`, `cfg.checkpoint.*` settings."""
        c = cfg.checkpoint
        return cls(
            f"{cfg.workdir.rstrip('/')}/checkpoints",
            every=c.every,
            keep=c.keep,
            async_save=c.async_save,
            config=cfg,
            allow_config_change=c.allow_config_change,
            read_only=read_only,
        )

    # ------------------------------------------------------------------ query
    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._mngr.all_steps())

    # ------------------------------------------------------------------- save
    def should_save(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def save(
        self,
        step: int,
        state: Any,
        *,
        key: jax.Array,
        data_state: Any = None,
        force: bool = False,
        extra: dict | None = None,
    ) -> bool:
        """Saves when `step` is on the interval (or `force`). Returns whether it saved."""
        if self.read_only:
            raise RuntimeError(f"checkpointer of {self.directory} is read-only: it cannot save")
        if not force and not self.should_save(step):
            return False
        if step in self._mngr.all_steps():
            return False
        cfg_dict = config_lib.config_to_dict(self.config) if self.config is not None else {}
        meta = {
            "data_state": data_state,
            "config": cfg_dict,
            "fingerprint": config_lib.fingerprint(cfg_dict) if cfg_dict else "",
            "step": int(step),
            # The PRNG key's words, in the JSON: as an array item it is host-local (each
            # process made its own), which orbax refuses to write with several processes,
            # so every multi-process run died at its first save.
            "key_data": np.asarray(jax.random.key_data(key)).tolist(),
            **(extra or {}),
        }
        items = {"train_state": state}
        return bool(
            self._mngr.save(
                int(step),
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(items), meta=ocp.args.JsonSave(meta)
                ),
                force=True,
            )
        )

    # ---------------------------------------------------------------- restore
    def read_meta(self, step: int | None = None) -> dict:
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        out = self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def check_config(self, meta: dict) -> None:
        """Raises IncompatibleCheckpointError naming every field that differs."""
        if self.config is None or self.allow_config_change or not meta.get("config"):
            return
        diff = config_lib.config_diff(meta["config"], self.config)
        if diff:
            saved = config_lib._flatten(meta["config"])
            now = config_lib._flatten(config_lib.config_to_dict(self.config))
            lines = [
                f"  {k}: checkpoint={saved.get(k, '<absent>')!r} now={now.get(k, '<absent>')!r}"
                for k in diff
            ]
            raise IncompatibleCheckpointError(
                f"checkpoint in {self.directory} (step {meta.get('step')}) was written with a "
                "different config:\n" + "\n".join(lines) + "\nUse the checkpoint's values, a new "
                "workdir, or --config.checkpoint.allow_config_change=True to load it anyway."
            )

    def restore(
        self, target_state: Any, key: jax.Array, step: int | None = None
    ) -> tuple[Any, jax.Array, Any, int]:
        """Restores onto the shardings of `target_state` (a live or abstract TrainState).

        Returns (state, key, data_state, step). Checks the config first. Without
        `step`: the newest kept step that reads back, falling back past damaged ones
        (warning, and moving them aside); DamagedCheckpointError when none reads.
        With `step`: that step or DamagedCheckpointError. A read that fails because
        of the storage or the process raises CheckpointUnavailableError and moves
        nothing (`unreadable_now`).
        """
        steps = sorted(self.all_steps(), reverse=True) if step is None else [int(step)]
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        failed: list[tuple[int, str]] = []
        for s in steps:
            unavailable: CheckpointUnavailableError | None = None
            try:
                out, error = self._read(s, target_state, key)
            except CheckpointUnavailableError as e:
                out, error, unavailable = None, None, e
            # Every process must restore the same step and move the same ones aside: each
            # judged its own read, so one that met damage (or a storage error) fell back
            # (or stopped) while the others resumed from the newer step, or hung in the
            # move's barrier.
            verdict = _agree(_UNAVAILABLE if unavailable else _DAMAGED if error else _READ)
            if verdict == _UNAVAILABLE:
                if unavailable is not None:
                    raise unavailable
                raise CheckpointUnavailableError(
                    f"another process cannot read checkpoint step {s} at {self._step_dir(s)} "
                    "now (see its log); it may be intact, so nothing was moved. Check that "
                    "process's storage and memory, then rerun to resume."
                )
            if verdict == _DAMAGED and error is None:
                error = "damaged as another process read it (see its log)"
            if error is not None:
                failed.append((s, error))
                later = [t for t in steps if t < s]
                log.warning(
                    "checkpoint step %d at %s is damaged (%s); %s",
                    s,
                    self._step_dir(s),
                    error,
                    f"falling back to step {later[0]}" if later else "no older checkpoint left",
                )
                continue
            if failed:
                self._move_aside([t for t, _ in failed])
            return out
        where = "; ".join(f"step {t} at {self._step_dir(t)}: {err}" for t, err in failed)
        raise DamagedCheckpointError(
            f"no checkpoint in {self.directory} can be restored ({where}). Refusing to restart "
            "from step 0 over them: repair or remove the damaged step directories, or use a "
            "new workdir."
        )

    def _read(self, step: int, target_state: Any, key: jax.Array) -> tuple[Any, str | None]:
        """(restored, None), or (None, the error) when the step is damaged.

        Reads twice before calling a step damaged; raises CheckpointUnavailableError
        when either read failed for a reason outside the step's bytes (`unreadable_now`).
        """
        errors: list[Exception] = []
        for attempt in range(2):
            try:
                out = self._restore_step(step, target_state, key)
            except IncompatibleCheckpointError:
                raise
            except Exception as e:  # noqa: BLE001 - orbax/TensorStore/JSON: classified below
                quiet_abandoned_reads()  # the other reads' reports (orbax_noise.py)
                errors.append(e)
                if attempt == 0:
                    time.sleep(_RETRY_PAUSE_S)
                continue
            if errors:
                log.warning(
                    "checkpoint step %d at %s failed to read once (%s); read again, it restored",
                    step,
                    self._step_dir(step),
                    short_error(errors[0]),
                )
            return out, None
        self._check_changed_state(step, errors[-1])
        now = [x for x in map(unreadable_now, errors) if x is not None]
        if now:
            raise CheckpointUnavailableError(
                f"cannot read checkpoint step {step} at {self._step_dir(step)} now "
                f"({short_error(now[-1])}); it may be intact, so nothing was moved. Check the "
                "storage (mount, permissions, free space) and host memory, then rerun to "
                "resume; if it keeps failing with those fine, move that step directory out "
                f"of {self.directory} to resume from the one before."
            ) from None
        return None, short_error(errors[-1])

    def _check_changed_state(self, step: int, error: Exception) -> None:
        """Under allow_config_change, a state that no longer fits the checkpoint's shapes
        or tree (a model size, gradient clipping on or off) is the config's doing, not
        damage: IncompatibleCheckpointError naming the changed fields. It was reported
        as a damaged checkpoint, with advice to remove the run's intact steps."""
        text = str(error)
        if not self.allow_config_change or not any(m in text for m in _SHAPE_MISMATCH):
            return
        try:
            saved = self.read_meta(step).get("config") or {}
        except Exception:  # noqa: BLE001 - unreadable meta: damage, judged by the caller
            return
        diff = config_lib.config_diff(saved, self.config) if self.config is not None else []
        if diff:
            raise IncompatibleCheckpointError(
                f"checkpoint step {step} in {self.directory} does not fit this run's state "
                f"({short_error(error)}): its config differs in {', '.join(diff)}, and "
                "allow_config_change loads changed settings, not changed parameter or "
                "optimizer shapes. Use the checkpoint's values for the fields that shape the "
                "state, or a new workdir."
            )

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _restore_step(self, step: int, target_state: Any, key: jax.Array) -> tuple:
        meta = self.read_meta(step)
        self.check_config(meta)
        target = {"train_state": _abstract(target_state)}
        if "key_data" not in meta:  # written before 2026-12-05: the key is an array item
            target["key"] = _abstract(jax.random.key_data(key))
        out = self._mngr.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
        )
        items = out["state"]
        words = meta["key_data"] if "key_data" in meta else items["key"]
        dtype = jax.random.key_data(key).dtype
        new_key = jax.random.wrap_key_data(
            np.asarray(words, dtype=dtype), impl=jax.random.key_impl(key)
        )
        return items["train_state"], new_key, meta.get("data_state"), int(step)

    def _move_aside(self, steps: list[int]) -> None:
        """Damaged steps newer than the restored one leave the manager's directory.

        Otherwise `save` would skip those steps (they exist) and the next restart
        would meet them again; moved, not deleted, so nothing is lost. Process 0 moves
        them; its failure stops every process in one line (they waited for it at a
        barrier, for ever, while it raised alone).
        """
        aside = self.directory.rstrip("/") + "-damaged"
        error = ""
        if jax.process_index() == 0:
            try:
                paths.makedirs(aside)
                for s in steps:
                    # A step damaged again in a later run goes beside the earlier copy.
                    dst, k = paths.join(aside, str(s)), 1
                    while paths.exists(dst):
                        dst, k = paths.join(aside, f"{s}.{k}"), k + 1
                    paths.move(self._step_dir(s), dst)
                    log.warning("moved damaged checkpoint step %d to %s", s, dst)
            except Exception as e:  # noqa: BLE001 - reported on every process below
                error = short_error(e)
        moved = not error
        if jax.process_count() > 1:
            from gdpo_jax.multihost import allgather

            moved = bool(allgather(np.asarray(moved)).all())
        if not moved:
            raise CheckpointUnavailableError(
                f"restored an older checkpoint but could not move the damaged steps {steps} "
                f"of {self.directory} aside to {aside} ({error or 'on process 0'}); move them "
                "out of that directory by hand, then rerun to resume."
            )
        self._mngr.reload()

    def wait(self) -> None:
        self._mngr.wait_until_finished()

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()


# Orbax's words for a restore target that does not fit the saved arrays.
_SHAPE_MISMATCH = ("tree structures do not match", "is not compatible with the stored shape")

# What a process made of its read of one step, ordered so that the worst one wins.
_READ, _DAMAGED, _UNAVAILABLE = 0, 1, 2


def _agree(verdict: int) -> int:
    """The worst of every process's verdict on a step (one process: its own)."""
    if jax.process_count() == 1:
        return verdict
    from gdpo_jax.multihost import allgather

    return int(allgather(np.asarray(verdict, np.int32)).max())


def _abstract(tree: Any) -> Any:
    def one(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        return abstract_of(x)

    return jax.tree.map(one, tree)
