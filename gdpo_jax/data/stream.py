"""Checkpointable, per-host prompt stream over a task's records (grain).

`grain.MapDataset.source(records).shuffle(seed).repeat()` is one global
stream, the same on every process; `take(n)` draws the next global batch of
`n * process_count` records and returns this process's contiguous share
(process p: records [p*n, (p+1)*n)). So the global batch, in the order the
sampler and the step lay rows out, does not depend on the process count
(a 2-process run sees the prompts a 1-process run sees; with dynamic sampling,
which keeps groups per process, the kept ones differ: docs/limits.md), and the iterator's
state (a small dict, identical on every process) goes into the checkpoint so
a resumed run sees exactly the prompts it would have seen.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

__all__ = ["PromptStream", "records_fingerprint"]


def records_fingerprint(records: Sequence[dict]) -> str:
    """16 hex digits of SHA-256 over the records, in order, as canonical JSON (keys
    sorted; arrays as lists). The stream's order is a function of the records and the
    seed, so a resumed run sees the prompts it would have seen only if this is unchanged
    (the checkpoint keeps it beside the stream's position)."""

    def plain(x: Any) -> Any:
        if isinstance(x, np.ndarray | np.generic):
            return x.tolist()
        return repr(x)  # anything else JSON cannot write: its repr, stable enough to compare

    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps(r, sort_keys=True, default=plain, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


class PromptStream:
    """Infinite iterator of records (dicts) for this host.

    Args:
      records: the task's training records (each a dict with at least "prompt").
      seed: shuffle seed (same on every host).
      process_index / process_count: this host's share of every global batch.
    """

    def __init__(
        self, records: Sequence[dict], *, seed: int, process_index: int = 0, process_count: int = 1
    ):
        if len(records) < process_count:
            raise ValueError(
                f"{len(records)} training records cannot be split over {process_count} processes."
            )
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index={process_index} must be in [0, {process_count}).")
        ds = grain.MapDataset.source(list(records))
        self._ds = ds.shuffle(seed=seed).repeat()
        # The records are in memory: read them synchronously. grain's default read
        # options start 16 prefetch threads per stream (reading up to 500 records
        # ahead), which outlived the Trainer that made the stream; the order and
        # the iterator state ({"next_index": i}) are the same either way.
        sync = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
        self._it = iter(self._ds.to_iter_dataset(sync))
        self.num_records = len(ds)
        self.process_index, self.process_count = process_index, process_count

    def take(self, n: int) -> list[dict]:
        """This process's n records of the next global batch of n * process_count."""
        batch = [next(self._it) for _ in range(n * self.process_count)]
        return batch[self.process_index * n : (self.process_index + 1) * n]

    def get_state(self) -> dict[str, Any]:
        return dict(self._it.get_state())

    def set_state(self, state: dict[str, Any]) -> None:
        self._it.set_state(dict(state))
