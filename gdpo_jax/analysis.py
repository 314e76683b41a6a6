"""Signal-resolution analysis: how many distinct advantage patterns an estimator yields.

The GDPO paper (Fig. 2-3) enumerates every multiset of G rollouts whose K
rewards are binary, applies an estimator, and counts the distinct sorted
advantage vectors: GRPO's "sum then normalize" maps different reward
combinations onto the same advantages (reward collapse); GDPO keeps them apart.
With K = 2, G = 2: GRPO 2, GDPO 3.

All multisets of one (G, K) go through a single ``compute_advantages`` call
(one group per multiset), so the count is exactly what the trainer's
estimator computes.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import jax
import numpy as np

from gdpo_jax.core.advantages import ESTIMATORS, compute_advantages

__all__ = [
    "count_distinct_advantage_groups",
    "count_distinct_rows",
    "distinct_advantage_counts",
    "enumerate_reward_multisets",
    "num_multisets",
]

# Guard against accidentally enumerating tens of millions of rows.
MAX_ROWS = 4_000_000


def num_multisets(num_generations: int, num_rewards: int) -> int:
    """Number of multisets of G rollouts over 2**K binary reward vectors."""
    types = 2**num_rewards
    return math.comb(types + num_generations - 1, num_generations)


def enumerate_reward_multisets(
    num_generations: int, num_rewards: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Every multiset of G rollouts with K binary rewards, one group per multiset.

    Returns:
      (rewards f32[M * G, K], group_ids i32[M * G], M); group m holds rows
      [m * G, (m + 1) * G).
    """
    g, k = int(num_generations), int(num_rewards)
    if g < 2 or k < 1:
        raise ValueError(f"need G >= 2 rollouts and K >= 1 rewards; got G={g}, K={k}.")
    m = num_multisets(g, k)
    if m * g > MAX_ROWS:
        raise ValueError(
            f"G={g}, K={k} has {m} multisets ({m * g} rows) > {MAX_ROWS} rows; "
            f"pick a smaller G or K."
        )
    types = np.array(list(itertools.product((0.0, 1.0), repeat=k)), np.float32)  # [2^K, K]
    combos = np.fromiter(
        itertools.chain.from_iterable(itertools.combinations_with_replacement(range(2**k), g)),
        dtype=np.int32,
        count=m * g,
    )
    rewards = types[combos]
    group_ids = np.repeat(np.arange(m, dtype=np.int32), g)
    return rewards, group_ids, m


def count_distinct_rows(adv: np.ndarray, tol: float = 1e-5) -> int:
    """Distinct rows of adv [M, G] as multisets (order within a group is irrelevant).

    Values are first clustered over the whole array: sorted, and a new value
    starts wherever the gap to the previous one exceeds ``tol``. Unlike
    rounding, this cannot split two equal values whose float32 noise straddles
    a rounding boundary (values equal in exact arithmetic may differ by a few
    ulps when computed from differently ordered groups).
    """
    adv = np.asarray(adv, np.float64)
    flat = adv.ravel()
    order = np.argsort(flat, kind="stable")
    starts = np.concatenate([[0], (np.diff(flat[order]) > tol).astype(np.int64)])
    labels = np.empty(flat.shape, np.int64)
    labels[order] = np.cumsum(starts)
    rows = np.sort(labels.reshape(adv.shape), axis=1)
    return int(np.unique(rows, axis=0).shape[0])


def distinct_advantage_counts(
    num_generations: int,
    num_rewards: int,
    estimators: Sequence[str] = ESTIMATORS,
    *,
    eps: float = 0.0,
    tol: float = 1e-5,
) -> dict[str, int]:
    """Distinct advantage groups for each estimator at one (G, K).

    Args:
      num_generations: G, rollouts per group (>= 2).
      num_rewards: K, binary rewards per rollout (>= 1).
      estimators: names from ``ESTIMATORS``.
      eps: std offset; 0 (divide only where std > 0) counts patterns exactly,
        whereas eps > 0 would split patterns that differ only at O(eps).
      tol: advantage values closer than this are the same value.
    Returns:
      {estimator: count}.
    """
    for e in estimators:
        if e not in ESTIMATORS:
            raise ValueError(f"unknown estimator {e!r}; choose from {ESTIMATORS}.")
    return dict(
        _counts(int(num_generations), int(num_rewards), tuple(estimators), float(eps), float(tol))
    )


@functools.lru_cache(maxsize=64)  # sweeps and notebooks revisit the same (G, K)
def _counts(
    num_generations: int, num_rewards: int, estimators: tuple[str, ...], eps: float, tol: float
) -> dict[str, int]:
    rewards, group_ids, m = enumerate_reward_multisets(num_generations, num_rewards)

    @jax.jit
    def all_advantages(r, ids):
        return {
            e: compute_advantages(r, ids, num_groups=m, estimator=e, eps=eps) for e in estimators
        }

    out = jax.device_get(all_advantages(rewards, group_ids))
    return {e: count_distinct_rows(out[e].reshape(m, num_generations), tol) for e in estimators}


def count_distinct_advantage_groups(
    num_generations: int,
    num_rewards: int,
    estimator: str = "gdpo",
    *,
    eps: float = 0.0,
    tol: float = 1e-5,
) -> int:
    """Paper Fig. 2-3 count for one estimator: e.g. (2, 2, "grpo") -> 2, (2, 2, "gdpo") -> 3."""
    return distinct_advantage_counts(num_generations, num_rewards, (estimator,), eps=eps, tol=tol)[
        estimator
    ]
