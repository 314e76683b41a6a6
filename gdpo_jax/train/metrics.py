"""Metrics out of the loop: JSONL (the record), TensorBoard, and a tqdm bar.

Only process 0 writes. The JSONL file is appended to, one object per step,
so a resumed run continues the same file; `read_jsonl` keeps the last record
for each step (a step logged before a kill and again after the resume).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

# Shown on the progress bar, when present, in this order.
_BAR_KEYS = ("reward/total", "adv/distinct_per_group", "loss", "kl", "len/mean", "time/step_s")


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
      enabled: False on processes other than 0.
    """

    def __init__(
        self,
        workdir: str,
        *,
        total_steps: int = 0,
        initial_step: int = 0,
        tensorboard: bool = True,
        progress_bar: bool = True,
        enabled: bool = True,
    ):
        self.enabled = enabled
        self._tb = None
        self._bar = None
        self._file = None
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._file = open(self.path, "a", buffering=1)
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tb"))
        if progress_bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total_steps, initial=initial_step, dynamic_ncols=True, desc="train"
            )

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Logs one step's scalar metrics (arrays are converted on the host)."""
        if not self.enabled:
            return
        record = {"step": int(step), **{k: _scalar(v) for k, v in metrics.items()}}
        assert self._file is not None
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, global_step=step)
        if self._bar is not None:
            shown = {
                k.split("/")[-1] if k.startswith("reward/") else k: record[k]
                for k in _BAR_KEYS
                if k in record
            }
            self._bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
            self._bar.n = step
            self._bar.refresh()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._file is not None:
            self._file.close()
        self._file = self._tb = self._bar = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_jsonl(path: str) -> dict[int, dict[str, Any]]:
    """step -> record; a step written twice (before a kill, after the resume) keeps the last."""
    out: dict[int, dict[str, Any]] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rec = json.loads(line)
                out[int(rec["step"])] = rec
    return out
