"""gdpo_jax.core.segment: per-group reductions over group ids, against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from gdpo_jax.core import segment


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_ids_outside_the_groups_contribute_nothing(op):
    # A padding id of -1 used to wrap, NumPy-style, into the last group; ids past
    # num_groups were dropped. Both are out of [0, num_groups) and must be ignored.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 3)).astype(np.float32)
    ids = np.array([0, 1, 2, -1, 2, 1, 5, 0, -3, 2, 1, 4])
    num_groups = 3
    fn = {"sum": segment.segment_sum, "max": segment.segment_max, "min": segment.segment_min}[op]
    got = np.asarray(fn(x, ids, num_groups))
    init = {"sum": 0.0, "max": -np.inf, "min": np.inf}[op]
    want = np.full((num_groups, 3), init, np.float32)
    for row, g in zip(x, ids, strict=True):
        if 0 <= g < num_groups:
            want[g] = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op](want[g], row)
    np.testing.assert_allclose(got, want, rtol=1e-6)
