"""Metrics out of the loop: JSONL (the record), TensorBoard, and a tqdm bar.

Only process 0 writes. The JSONL file is appended to, one object per step,
so a resumed run continues the same file. A run resumed at step S first drops
the records of steps after S (logged by the attempt that was killed after its
last checkpoint: with a changed `train.num_steps` or `log_every` nothing
overwrote them, and reports read them as the finished run's) and a torn last
line, and TensorBoard purges the same steps. `read_jsonl` keeps the last
record for each step.
TensorBoard tags are grouped by prefix (`tb_tag`): reward/*, adv/*, loss/*,
optim/*, perf/*, time/*, len/*, data/*, eval/*. A URL workdir (gs://...) is
written through a local mirror uploaded every `sync_every_s` and at close.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gdpo_jax.train import paths

# Shown on the progress bar, when present, in this order.
_BAR_KEYS = ("reward/total", "adv/distinct_per_group", "loss", "kl", "len/mean", "time/step_s")
_GROUPS = ("reward/", "adv/", "loss/", "optim/", "perf/", "time/", "len/", "data/", "eval/")
# Ungrouped step metrics -> their TensorBoard group (the JSONL keeps the plain names).
_TB_GROUP = {
    **dict.fromkeys(
        ("loss", "pg_loss", "kl", "approx_kl", "entropy", "clip_frac", "clip_frac_high"),
        "loss",
    ),
    **dict.fromkeys(("clip_frac_low", "clip_frac_dual", "kl_in_reward"), "loss"),
    **dict.fromkeys(("ratio_max", "ratio_mean", "ratio_min"), "loss"),
    **dict.fromkeys(("lr", "grad_norm", "update_norm", "param_norm", "nonfinite_updates"), "optim"),
}


def tb_tag(key: str) -> str:
    """TensorBoard tag of a metric, so that the dashboard shows a few groups.

    reward_failures/x -> reward/failures/x, reward_time/x -> time/reward/x,
    loss -> loss/loss, lr -> optim/lr; grouped keys are kept.
    """
    if key.startswith(_GROUPS):
        return key
    head, sep, rest = key.partition("/")
    if sep and head.startswith("reward_"):
        kind = head[len("reward_") :]
        return f"time/reward/{rest}" if kind == "time" else f"reward/{kind}/{rest}"
    if key in _TB_GROUP:
        return f"{_TB_GROUP[key]}/{key}"
    return key if sep else f"misc/{key}"


def _scalar(v: Any) -> float | int | str:
    if isinstance(v, (str, bool, int)):
        return v
    v = np.asarray(v)
    if v.dtype.kind in "iu":
        return int(v)
    return float(v)


class MetricsWriter:
    """Writes per-step metric dicts to `<workdir>/metrics.jsonl` (+ TensorBoard, + tqdm).

    Args:
      workdir: run directory.
      total_steps: length of the progress bar.
      initial_step: where the bar starts (a resumed run).
      resume_step: the step the run starts from (its checkpoint's, 0 for a fresh run):
        records of later steps are dropped from the file and purged from TensorBoard.
        None (a writer adding records to a run) keeps them.
      enabled: False on processes other than 0.
    """

    def __init__(
        self,
        workdir: str,
        *,
        total_steps: int = 0,
        initial_step: int = 0,
        resume_step: int | None = None,
        tensorboard: bool = True,
        progress_bar: bool = True,
        enabled: bool = True,
    ):
        self.enabled = enabled
        self._tb = None
        self._bar = None
        self._file = None
        self._mirror: paths.LocalMirror | None = None
        self._synced = time.monotonic()
        self.sync_every_s = 60.0
        if not enabled:
            return
        # Object stores cannot append: write locally, upload on sync.
        self._mirror = (
            paths.LocalMirror(workdir, ("metrics.jsonl",)) if paths.is_url(workdir) else None
        )
        local = self._mirror.local if self._mirror else workdir
        os.makedirs(local, exist_ok=True)
        self.path = paths.join(workdir, "metrics.jsonl")
        self._local_path = os.path.join(local, "metrics.jsonl")
        self._tb_dir = os.path.join(local, "tb")
        if resume_step is not None:
            keep_through(self._local_path, resume_step)
        self._file = open(self._local_path, "a", buffering=1)
        if tensorboard:
            self._tb = self._tb_writer(None if resume_step is None else resume_step + 1)
        if progress_bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total_steps, initial=initial_step, dynamic_ncols=True, desc="train"
            )

    def _tb_writer(self, purge_step: int | None) -> Any:
        """A new TensorBoard event file; TensorBoard drops the events of steps >=
        purge_step written before it (None: none)."""
        from tensorboardX import SummaryWriter

        # The file name holds the second it was made: a writer opened in the same
        # second as an earlier one (a quick resume) overwrote its events.
        return SummaryWriter(
            self._tb_dir, purge_step=purge_step, filename_suffix=f".{time.time_ns()}"
        )

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Logs one step's scalar metrics (arrays are converted on the host)."""
        if not self.enabled:
            return
        record = {"step": int(step), **{k: _scalar(v) for k, v in metrics.items()}}
        assert self._file is not None
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._show(record)

    def replace(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Writes `metrics` as the one record of `step`, replacing the records of `step`
        and later ones already written: the file is rewritten atomically (a kill leaves
        the old records or the new one), and TensorBoard gets a new event file purging
        them. SFT's final record (the last step's training metrics and the final eval)
        replaces the step's training-only record, written first so that a kill in the
        eval loses nothing; appended, each rerun of a finished run added a copy."""
        if not self.enabled:
            return
        record = {"step": int(step), **{k: _scalar(v) for k, v in metrics.items()}}
        assert self._file is not None
        self._file.close()
        keep_through(self._local_path, int(step) - 1, then=[record])
        self._file = open(self._local_path, "a", buffering=1)
        if self._tb is not None:
            self._tb.close()
            self._tb = self._tb_writer(int(step))
        self._show(record, sync=True)

    def _show(self, record: dict[str, Any], *, sync: bool = False) -> None:
        """TensorBoard, the progress bar and the URL mirror's sync (every sync_every_s,
        or now) for one record."""
        step = record["step"]
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(tb_tag(k), v, global_step=step)
        if self._bar is not None:
            shown = {
                k.split("/")[-1] if k.startswith("reward/") else k: record[k]
                for k in _BAR_KEYS
                if k in record
            }
            self._bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
            self._bar.n = step
            self._bar.refresh()
        if self._mirror is not None and (
            sync or time.monotonic() - self._synced > self.sync_every_s
        ):
            self.flush()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        if self._tb is not None:
            self._tb.flush()
        if self._mirror is not None:
            self._mirror.sync()
            self._synced = time.monotonic()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._file is not None:
            self._file.close()
        if self._mirror is not None:
            self._mirror.close()
        self._file = self._tb = self._bar = self._mirror = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _records(lines: list[str], path: str) -> list[dict[str, Any]]:
    """The JSON records of a metrics file's lines; a torn last line (a kill in the
    middle of a write) is left out, a bad line elsewhere raises a ValueError."""
    out = []
    for i, line in enumerate(lines):
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}, line {i + 1}: not a JSON record ({e.msg}).") from None
    return out


def keep_through(path: str, step: int, *, then: Sequence[dict[str, Any]] = ()) -> None:
    """Rewrites the local metrics file `path` with only its records of steps <= `step`
    (and without a torn last line), followed by the records `then`; atomic, so a kill
    here loses nothing."""
    lines = []
    if os.path.exists(path):
        with open(path) as f:
            lines = f.readlines()
    elif not then:
        return
    kept = [r for r in _records(lines, path) if int(r["step"]) <= step]
    whole = [line for line in lines if line.strip()]
    if not then and len(kept) == len(whole) and (not lines or lines[-1].endswith("\n")):
        return  # nothing to drop: the file stays as it is
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r, allow_nan=True) + "\n" for r in [*kept, *then])
    os.replace(tmp, path)


def read_jsonl(path: str) -> dict[int, dict[str, Any]]:
    """step -> record; a step written twice (before a kill, after the resume) keeps the
    last. A torn last line (a run killed while writing it) is left out."""
    with paths.open_file(path) as f:
        lines = f.readlines()
    return {int(rec["step"]): rec for rec in _records(lines, path)}
