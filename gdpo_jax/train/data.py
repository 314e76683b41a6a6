"""Checkpointable, per-host prompt stream over a task's records (grain).

`grain.MapDataset.source(records)[host::hosts].shuffle(seed).repeat()`: each
process reads its own disjoint slice, reshuffled every epoch with the seed;
the iterator's state (a small dict) goes into the checkpoint so a resumed run
sees exactly the prompts it would have seen.
"""
from __future__ import annotations

from typing import Any, Sequence

import grain


class PromptStream:
    """Infinite iterator of records (dicts) for this host.

    Args:
      records: the task's training records (each a dict with at least "prompt").
      seed: shuffle seed (same on every host; the slices are disjoint).
      process_index / process_count: this host's slice.
    """

    def __init__(self, records: Sequence[dict], *, seed: int, process_index: int = 0,
                 process_count: int = 1):
        if len(records) < process_count:
            raise ValueError(f"{len(records)} training records cannot be split over "
                             f"{process_count} processes.")
        ds = grain.MapDataset.source(list(records))
        if process_count > 1:
            ds = ds[process_index::process_count]
        self._ds = ds.shuffle(seed=seed).repeat()
        self._it = iter(self._ds.to_iter_dataset())
        self.num_records = len(ds)

    def take(self, n: int) -> list[dict]:
        return [next(self._it) for _ in range(n)]

    def get_state(self) -> dict[str, Any]:
        return dict(self._it.get_state())

    def set_state(self, state: dict[str, Any]) -> None:
        self._it.set_state(dict(state))
