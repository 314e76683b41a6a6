"""Diagnostics over groups: how much signal a batch's groups carry.

`group_distinct_advantages` (the advantage's resolution per group, a metric of the
compiled step) and `per_reward_group_spread` (which (group, reward) pairs have any
spread: dynamic sampling's test, which the rollout runs in NumPy as
`gdpo_jax.train.rollout.groups_with_signal`). Pure jnp, jit-able, rows sharded or not, with the
same row / group-id semantics as `gdpo_jax.core.advantages`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gdpo_jax.core import segment as seg
from gdpo_jax.core.rows import check_group_ids, check_num_groups, check_valid, row_mask

__all__ = ["group_distinct_advantages", "per_reward_group_spread"]


def group_distinct_advantages(
    adv: jax.Array,
    group_ids: jax.Array,
    *,
    num_groups: int,
    valid: jax.Array | None = None,
    decimals: int = 4,
) -> jax.Array:
    """Mean number of distinct advantage values per group (signal resolution).

    Args:
      adv: f32[N] advantages.
      group_ids: i32[N]; ids outside [0, num_groups) count as invalid.
      num_groups: static.
      valid: bool[N] rows to count (default all).
      decimals: values equal after rounding to this many decimals are one value.
    Returns:
      f32[] mean over groups with >= 1 valid row (0 if there are none).
    """
    adv = jnp.asarray(adv, jnp.float32)
    if adv.ndim != 1:
        raise ValueError(f"adv must be rank 1, [N]; got shape {tuple(adv.shape)}.")
    n = adv.shape[0]
    num_groups = check_num_groups(num_groups)
    group_ids = check_group_ids(group_ids, n)
    valid = check_valid(valid, n)
    rows = seg.explicit_rows(adv)
    group_ids, valid = seg.match_rows(group_ids, rows), seg.match_rows(valid, rows)
    row_ok = row_mask(group_ids, valid, num_groups)
    # Sort by (group, rounded value); invalid rows sort last under id num_groups.
    # Sorting needs the whole row axis on each device in Explicit mode.
    key_g = seg.replicate(jnp.where(row_ok, group_ids, num_groups), rows)
    key_v = seg.replicate(jnp.round(adv, decimals) + 0.0, rows)  # +0.0: -0.0 -> 0.0
    key_g, key_v = jax.lax.sort((key_g, key_v), num_keys=2)
    new = jnp.concatenate(
        [jnp.ones((1,), bool), (key_g[1:] != key_g[:-1]) | (key_v[1:] != key_v[:-1])]
    )
    distinct = jnp.sum(new & (key_g < num_groups))
    group_start = jnp.concatenate([jnp.ones((1,), bool), key_g[1:] != key_g[:-1]])
    groups = jnp.sum(group_start & (key_g < num_groups))
    return distinct.astype(jnp.float32) / jnp.maximum(groups, 1).astype(jnp.float32)


def per_reward_group_spread(
    rewards: jax.Array, group_ids: jax.Array, *, num_groups: int, valid: jax.Array | None = None
) -> jax.Array:
    """Which (group, reward) pairs carry signal: > 1 distinct scorable value.

    Under GDPO a group whose *summed* reward is constant can still carry signal
    in one reward, so dynamic sampling must look at each reward separately.

    Args:
      rewards: f32[N, K] (NaN or +/-inf = unscorable, ignored).
      group_ids: i32[N]; ids outside [0, num_groups) count as invalid.
      num_groups: static.
      valid: bool[N] (default all).
    Returns:
      bool[num_groups, K].
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be rank 2, [N, K]; got shape {tuple(rewards.shape)}.")
    n = rewards.shape[0]
    num_groups = check_num_groups(num_groups)
    group_ids = check_group_ids(group_ids, n)
    valid = check_valid(valid, n)
    rows = seg.explicit_rows(rewards)
    group_ids, valid = seg.match_rows(group_ids, rows), seg.match_rows(valid, rows)
    row_ok = row_mask(group_ids, valid, num_groups)
    ids = jnp.where(row_ok, group_ids, 0)
    scorable = row_ok[:, None] & jnp.isfinite(rewards)  # as compute_advantages
    hi = seg.segment_max(jnp.where(scorable, rewards, -jnp.inf), ids, num_groups, rows)
    lo = seg.segment_min(jnp.where(scorable, rewards, jnp.inf), ids, num_groups, rows)
    return hi > lo
