"""Group-relative advantage estimators: GRPO and GDPO (and their ablations).

All functions are pure ``jnp`` and jit-able; ``num_groups``, ``estimator``,
``eps`` and ``batch_norm`` are static Python values. Rows may be sharded over
any mesh (Auto or Explicit axes): group statistics are segment reductions over
group ids (see ``gdpo_jax.core.segment``), batch statistics are global sums.

Semantics follow the official GDPO TRL patch with TRL-main's NaN handling:

* std is the unbiased sample std (ddof=1) and ``eps`` is added to it at the
  group normalization and at the "sample" batch whitening ("token" uses
  rsqrt(var + 1e-8));
* a non-finite reward (NaN, +inf or -inf) is unscorable: it is left out of
  that reward's group statistics and contributes 0 to the row's GDPO sum; for
  GRPO variants it counts as 0 in the weighted sum (``nansum``). An infinite
  reward is a broken reward function, not a huge score: taking it at face
  value would make its whole group (GRPO) or batch (GDPO, via the batch
  whitening) NaN;
* concrete non-finite ``weights`` are rejected before any work (a NaN weight
  would make every advantage NaN; traced weights are not checked);
* an optional per-row ``penalty`` (the KL-in-reward term ``-coef * KL_seq``)
  is *not* a reward column: GRPO adds it to the weighted reward sum before
  the group normalization (verl's KL-in-reward), GDPO adds it to the weighted
  sum of normalized rewards before the batch whitening, so its coefficient
  sets its strength (see ``compute_advantages``);
* a group (or per-reward group) with fewer than 2 scorable rows contributes 0;
  a group whose values are all equal contributes exactly 0 (means are taken
  relative to a value of the group, so no rounding residue is amplified by
  1/eps);
* invalid rows (``valid=False``, or a group id outside ``[0, num_groups)``)
  are left out of every statistic and get advantage 0;
* GDPO's batch whitening uses the mean and ddof=1 std of the valid rows of the
  whole (global) batch, or with ``batch_norm="token"`` verl's token-weighted
  ``masked_whiten``: mean/var over valid response tokens (each row weighted by
  its token count, Bessel-corrected over tokens), scaled by rsqrt(var + 1e-8).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gdpo_jax.core import segment as seg

# Diagnostics of the same group statistics, importable from here as before.
from gdpo_jax.core.group_stats import group_distinct_advantages, per_reward_group_spread
from gdpo_jax.core.rows import check_group_ids, check_num_groups, check_valid, row_mask

__all__ = [
    "BATCH_NORMS",
    "ESTIMATORS",
    "NAN_REWARDS",
    "compute_advantages",
    "gate_reward",
    "group_distinct_advantages",
    "per_reward_group_spread",
    "rewards_as_read",
]

ESTIMATORS = ("grpo", "grpo_no_std", "gdpo", "gdpo_no_bn")
# Unscorable (NaN / +-inf) rewards: "omit" (TRL main: out of that reward's group
# statistics, 0 advantage) or "zero" (the official GDPO TRL patch's nan_to_num: a 0
# reward that counts in them, biasing its group).
NAN_REWARDS = ("omit", "zero")
BATCH_NORMS = ("sample", "token")
# verl's masked_whiten adds this to the variance; kept verbatim for parity.
_VERL_WHITEN_EPS = 1e-8


def rewards_as_read(rewards: jax.Array, *, estimator: str, nan_rewards: str) -> jax.Array:
    """f32[N, K] rewards as `compute_advantages(estimator, nan_rewards)` reads them: an
    unscorable (non-finite) entry is a 0 under GRPO's sum (always) and under
    nan_rewards="zero"; under GDPO's default "omit" it stays non-finite (left out).

    For diagnostics that measure an advantage against its rewards (`reward_shares`): a
    NaN left out there but summed as 0 by GRPO pulled GRPO's shares down."""
    rewards = jnp.asarray(rewards, jnp.float32)
    if estimator in ("grpo", "grpo_no_std") or nan_rewards == "zero":
        return jnp.where(jnp.isfinite(rewards), rewards, 0.0)
    return rewards


# --------------------------------------------------------------------------- #
# Input checking (static, at trace time).
# --------------------------------------------------------------------------- #
def _as_float_array(x: Any, name: str, fix: str) -> jax.Array:
    """``x`` as an f32 array (None becomes NaN), or a one-line error naming ``name``
    (e.g. a ragged nested list or a non-numeric string)."""
    if isinstance(x, jax.Array):
        return x.astype(jnp.float32)
    try:
        arr = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"compute_advantages: {name} must be a numeric array ({e}); {fix}."
        ) from None
    return jnp.asarray(arr)


def _check_finite(x: jax.Array, name: str, fix: str) -> None:
    """Raises naming the first non-finite entry of a concrete ``x`` (no-op when traced)."""
    if isinstance(x, jax.core.Tracer):
        return
    bad = np.flatnonzero(~np.isfinite(np.asarray(x)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"compute_advantages: {name} has a non-finite value at index {i} "
            f"({float(np.asarray(x).reshape(-1)[i])}); {fix}."
        )


# --------------------------------------------------------------------------- #
# Group statistics.
# --------------------------------------------------------------------------- #
def _group_normalize(
    x: jax.Array, mask: jax.Array, ids: jax.Array, num_groups: int, *, eps: float, scale: bool, rows
) -> jax.Array:
    """Per-group, per-column (x - mean) / (std + eps) over masked entries.

    Args:
      x: f32[N, C] values (may hold NaN where ``mask`` is False).
      mask: bool[N, C] entries that enter the statistics.
      ids: i32[N] group ids, already clipped into range.
      scale: divide by (std + eps) (False: centre only, "grpo_no_std").
    Returns:
      f32[N, C]; 0 where ``mask`` is False or the group has < 2 masked entries.
    """
    x = jnp.where(mask, x, 0.0)
    m = mask.astype(jnp.float32)
    # Reference value per group (its max): statistics of x - ref are exact for
    # a constant group, so it yields exactly 0 instead of rounding noise / eps.
    ref = seg.segment_max(jnp.where(mask, x, -jnp.inf), ids, num_groups, rows)
    ref = jnp.where(jnp.isfinite(ref), ref, 0.0)
    d = jnp.where(mask, x - seg.take_rows(ref, ids, rows), 0.0)
    tot = seg.segment_sum(jnp.concatenate([m, d], axis=1), ids, num_groups, rows)
    c = x.shape[1]
    count, dsum = tot[:, :c], tot[:, c:]
    ok = count >= 2
    dmean = dsum / jnp.maximum(count, 1.0)
    dev = jnp.where(mask, d - seg.take_rows(dmean, ids, rows), 0.0)
    if scale:
        ss = seg.segment_sum(dev * dev, ids, num_groups, rows)
        denom = jnp.sqrt(ss / jnp.maximum(count - 1.0, 1.0)) + eps
        denom = jnp.where(ok, denom, 1.0)
        # eps == 0 (NeMo-RL style): divide only where std > 0.
        denom_r = seg.take_rows(jnp.where(denom > 0, denom, jnp.inf), ids, rows)
        dev = dev / denom_r
    keep = mask & seg.take_rows(ok, ids, rows)
    return jnp.where(keep, dev, 0.0)


def _batch_whiten(
    s: jax.Array, row_ok: jax.Array, *, eps: float, batch_norm: str, token_counts: jax.Array | None
) -> jax.Array:
    """Whitens f32[N] over the valid rows of the whole batch; 0 on invalid rows (and, by
    tokens, on rows without a response token: no token carries their advantage)."""
    if batch_norm == "sample":
        w = row_ok.astype(jnp.float32)
    else:  # "token": each row counts once per valid response token (verl).
        w = jnp.where(row_ok, token_counts.astype(jnp.float32), 0.0)
        # A row of weight 0 is outside the statistics; whitened all the same it came out
        # near 1e4 when the other rows had no spread, in the step's adv/* metrics.
        row_ok = row_ok & (w > 0)
    total = jnp.sum(w)
    mean = jnp.sum(w * s) / jnp.maximum(total, 1.0)
    dev = jnp.where(row_ok, s - mean, 0.0)
    var = jnp.sum(w * dev * dev) / jnp.maximum(total - 1.0, 1.0)
    if batch_norm == "sample":
        std = jnp.sqrt(var) + eps
        out = dev / jnp.where(std > 0, std, jnp.inf)
    else:
        out = dev * jax.lax.rsqrt(var + _VERL_WHITEN_EPS)
    # A batch whose rows all sum to one value (a KL-in-reward penalty alike on every row)
    # has no spread: exactly 0, as a constant group. sum(s)/N leaves a rounding residue
    # that the division by its tiny std blew up to O(1) (eps = 0) or O(1e-3) (eps = 1e-4,
    # x1e4 under verl's token mode). A select on max == min, not a shift of s before the
    # sums: GDPO's sums are near zero-mean already, and shifting them by a row's value
    # made the sums' rounding depend on the device count (1e-4 in a two-process run's
    # gradient norm).
    # `initial`: an empty batch (N = 0) is empty advantages, not a reduction error.
    hi = jnp.max(jnp.where(row_ok, s, -jnp.inf), initial=-jnp.inf)
    lo = jnp.min(jnp.where(row_ok, s, jnp.inf), initial=jnp.inf)
    return jnp.where(row_ok & (hi > lo), out, 0.0)


# --------------------------------------------------------------------------- #
# Public API.
# --------------------------------------------------------------------------- #
def compute_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    *,
    num_groups: int,
    estimator: str = "gdpo",
    weights: jax.Array | None = None,
    valid: jax.Array | None = None,
    eps: float = 1e-4,
    batch_norm: str = "sample",
    token_counts: jax.Array | None = None,
    penalty: jax.Array | None = None,
    nan_rewards: str = "omit",
) -> jax.Array:
    """Per-rollout advantages from K rewards per rollout.

    Args:
      rewards: f32[N, K], one column per reward function; NaN, +/-inf (or None
        in a nested list, read as NaN like the reward runner does) = unscorable.
      group_ids: i32[N] group (prompt) of each row, in [0, num_groups); ragged
        and non-contiguous groups are fine; ids outside the range (e.g. -1 for
        padding) mark the row invalid.
      num_groups: static number of groups (segment table size).
      estimator: one of ESTIMATORS (p = ``penalty``, 0 when None):
        "grpo"        s = sum_k w_k r_k + p; A = (s - mean_g) / (std_g + eps)
        "grpo_no_std" A = s - mean_g
        "gdpo"        A_k = (r_k - mean_gk) / (std_gk + eps); S = sum_k w_k A_k + p;
                      A = whiten(S) over the batch's rows with a scorable reward
                      (a row with none gets 0, as in TRL main)
        "gdpo_no_bn"  A = S
      weights: f32[K] finite reward weights (default ones); applied before
        group normalization for GRPO, after it for GDPO.
      valid: bool[N] rows that exist (default all); others get 0 and are left
        out of every statistic.
      eps: static float added to the std at group normalization and at the
        "sample" batch whitening;
        0.0 divides only where std > 0 (NeMo-RL).
      batch_norm: GDPO batch whitening, "sample" (TRL: per-row mean and ddof=1
        std, + eps) or "token" (verl: token-weighted, rsqrt(var + 1e-8); a row
        with no response token gets 0).
      token_counts: i32[N] valid response tokens per row, for "token".
      penalty: f32[N] per-row term of fixed strength, e.g. KL in the reward,
        ``-coef * sum_t (logp_old - logp_ref)``; NaN/inf count as 0.
        GRPO adds it to the weighted reward sum before the group
        normalization (verl's KL-in-reward, today's GRPO recipe). GDPO does
        not normalize it as a reward (that would make it a third objective as
        strong as each task reward whatever its coefficient): it is added to
        S, the weighted sum of the per-reward normalized advantages, before
        the batch whitening. Each normalized reward has within-group std ~1,
        so ``coef`` weighs one nat of sequence KL against one std of a task
        reward, and the whitening keeps the final advantages at unit scale
        (clip range and learning rate mean the same with or without the
        penalty; adding it after the whitening would instead shift the mean
        advantage by -coef * mean KL). ms-swift forces KL-in-reward off under
        GDPO and verl adds it to the token rewards before any estimator.
      nan_rewards: one of NAN_REWARDS, what an unscorable reward is under GDPO:
        "omit" (default, TRL main) leaves it out of its reward's group statistics
        with 0 advantage; "zero" reads it as a 0 reward in them (the official TRL
        patch's nan_to_num, for comparisons with it). GRPO sums the rewards with
        non-finite ones as 0 either way.
    Returns:
      f32[N] advantages, laid out like the rows of ``rewards``.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose one of {ESTIMATORS}.")
    if nan_rewards not in NAN_REWARDS:
        raise ValueError(f"unknown nan_rewards {nan_rewards!r}; choose one of {NAN_REWARDS}.")
    if batch_norm not in BATCH_NORMS:
        raise ValueError(f"unknown batch_norm {batch_norm!r}; choose one of {BATCH_NORMS}.")
    rewards = _as_float_array(
        rewards, "rewards", "pass f32[N, K] with NaN for an unscorable reward"
    )
    if rewards.ndim != 2:
        raise ValueError(
            f"rewards must be rank 2, [N, K] (rows x reward functions); got shape "
            f"{tuple(rewards.shape)}. For a single reward use rewards[:, None]."
        )
    n, k = rewards.shape
    if k < 1:
        raise ValueError("rewards must have at least one column (K >= 1).")
    num_groups = check_num_groups(num_groups)
    group_ids = check_group_ids(group_ids, n)
    valid = check_valid(valid, n)
    if weights is None:
        weights = jnp.ones((k,), jnp.float32)
    weights = _as_float_array(weights, "weights", "pass one finite float weight per reward")
    if weights.shape != (k,):
        raise ValueError(
            f"weights must have one entry per reward column, shape [K]=[{k}]; got "
            f"shape {tuple(weights.shape)}."
        )
    _check_finite(weights, "weights", "pass finite reward weights")
    if float(eps) < 0:
        raise ValueError(f"eps must be >= 0; got {eps}.")
    if batch_norm == "token":
        if token_counts is None:
            raise ValueError(
                'batch_norm="token" whitens over response tokens and needs '
                "token_counts=i32[N] (e.g. completion_mask.sum(-1))."
            )
        token_counts = jnp.asarray(token_counts)
        if token_counts.shape != (n,):
            raise ValueError(
                f"token_counts must have shape [N]=[{n}]; got {tuple(token_counts.shape)}."
            )
    if penalty is not None:
        penalty = _as_float_array(penalty, "penalty", "pass f32[N], one value per row")
        if penalty.shape != (n,):
            raise ValueError(
                f"penalty must have shape [N]=[{n}] (one value per row of rewards); got "
                f"{tuple(penalty.shape)}."
            )

    rows = seg.explicit_rows(rewards)
    group_ids = seg.match_rows(group_ids, rows)
    valid = seg.match_rows(valid, rows)
    row_ok = row_mask(group_ids, valid, num_groups)
    ids = jnp.where(row_ok, group_ids, 0)
    # inf is unscorable like NaN: one inf would make its group's (or, through
    # the batch whitening, the whole batch's) statistics NaN.
    # GRPO's sum and nan_rewards="zero" read one as 0 (one rule, shared with the share
    # diagnostic: `rewards_as_read`); GDPO's "omit" leaves it out of its reward's stats.
    rewards = rewards_as_read(rewards, estimator=estimator, nan_rewards=nan_rewards)
    scorable = jnp.isfinite(rewards)
    pen = 0.0
    if penalty is not None:
        penalty = seg.match_rows(penalty, rows)
        pen = jnp.where(row_ok & jnp.isfinite(penalty), penalty, 0.0)

    if estimator in ("grpo", "grpo_no_std"):
        s = jnp.sum(rewards * weights, axis=1) + pen
        adv = _group_normalize(
            s[:, None],
            row_ok[:, None],
            ids,
            num_groups,
            eps=eps,
            scale=estimator == "grpo",
            rows=rows,
        )[:, 0]
        return adv

    per_reward = _group_normalize(
        rewards, row_ok[:, None] & scorable, ids, num_groups, eps=eps, scale=True, rows=rows
    )
    s = jnp.sum(per_reward * weights, axis=1) + pen
    if estimator == "gdpo_no_bn":
        return jnp.where(row_ok, s, 0.0)
    if token_counts is not None:
        token_counts = seg.match_rows(token_counts, rows)
    # A row that no reward scored carries no task signal: out of the batch statistics,
    # advantage 0 (TRL main: its sum is NaN). Counted with a sum of 0 it shrank the
    # batch std, which scaled every other row's advantage up (by sqrt(7/6) in 8 rows).
    scored = row_ok & jnp.any(scorable, axis=1)
    return _batch_whiten(s, scored, eps=eps, batch_norm=batch_norm, token_counts=token_counts)


def gate_reward(reward: jax.Array, condition: jax.Array, threshold: float | jax.Array) -> jax.Array:
    """Conditioned reward (paper eq. 8): ``reward`` where ``condition >= threshold``, else 0.

    Args:
      reward: f[...] reward to gate (NaN stays NaN where the gate is open).
      condition: f[...] the reward it is conditioned on (same shape).
      threshold: scalar.
    Returns:
      f[...]; NaN where ``condition`` is NaN or +-inf (unscorable, so the gate
      cannot be decided and the gated reward is unscorable too).
    """
    reward = jnp.asarray(reward)
    condition = jnp.asarray(condition)
    if reward.shape != condition.shape:
        raise ValueError(
            f"reward and condition must have the same shape; got {reward.shape} "
            f"and {condition.shape}."
        )
    gated = jnp.where(condition >= threshold, reward, jnp.zeros_like(reward))
    # +-inf is unscorable for the advantages (as NaN), so it decides no gate either.
    return jnp.where(~jnp.isfinite(condition), jnp.nan, gated).astype(
        jnp.result_type(reward.dtype, jnp.float32)
    )
