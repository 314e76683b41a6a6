"""Pieces shared by the task modules: record loading loop, grouping."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gdpo_jax.data.loaders import PathLike, RecordError, iter_records

Normalizer = Callable[[dict, str, int], dict]


def load_records(
    path: PathLike | Sequence[PathLike] | Sequence[Mapping],
    normalize: Normalizer,
    *,
    split: str | None = None,
    backend: str = "auto",
    limit: int | None = None,
) -> list[dict]:
    """Reads records from files (or takes in-memory dicts) and normalizes each.

    normalize(record, file, row) -> task record with at least "prompt" (chat
    messages); it raises RecordError naming the file, row and field.
    """
    if isinstance(path, (list, tuple)) and path and isinstance(path[0], Mapping):
        rows = (("<memory>", i, dict(r)) for i, r in enumerate(path))
    else:
        rows = iter_records(path, split=split, backend=backend)
    out = []
    for f, i, rec in rows:
        if limit is not None and len(out) >= limit:
            break
        out.append(normalize(rec, f, i))
    if not out:
        raise RecordError(str(path), None, None, "no records")
    return out


def parse_json_field(value: Any, path: str, row: int, field: str) -> Any:
    """A field that datasets store either as JSON text or as a nested value."""
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise RecordError(
                path, row, field, f"invalid JSON text ({e.msg} at column {e.colno})"
            ) from e
    return value


def group_ids_for(examples: Sequence[Mapping], group_ids: Sequence[int] | None) -> np.ndarray:
    """i64[N] problem id per sample: given, or from identical prompts (first seen order)."""
    if group_ids is not None:
        g = np.asarray(group_ids)
        if g.shape != (len(examples),):
            raise ValueError(f"group_ids has shape {g.shape}, expected ({len(examples)},)")
        return g.astype(np.int64)
    seen: dict[str, int] = {}
    return np.asarray(
        [
            seen.setdefault(json.dumps(ex.get("prompt"), sort_keys=True, default=str), len(seen))
            for ex in examples
        ],
        np.int64,
    )


def mean_over_groups(values: np.ndarray, groups: np.ndarray) -> float:
    """Mean over groups of the within-group mean (NaN entries ignored)."""
    per = []
    for g in np.unique(groups):
        v = values[groups == g]
        v = v[~np.isnan(v)]
        if v.size:
            per.append(v.mean())
    return float(np.mean(per)) if per else float("nan")
