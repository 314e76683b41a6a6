"""Writes a jax.profiler-style trace for the trace parsers' tests."""

from __future__ import annotations

import gzip
import json
import pathlib


def write_trace(root: pathlib.Path, events: list[dict], day: str = "2026_12_03") -> None:
    """Writes `events` as <root>/plugins/profile/<day>/perfetto_trace.json.gz, where
    jax.profiler.start_trace(root, create_perfetto_trace=True) leaves its trace."""
    d = root / "plugins" / "profile" / day
    d.mkdir(parents=True)
    with gzip.open(d / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
