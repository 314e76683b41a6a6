"""Live diagnostics of the learning signal: which reward the advantage follows.

``reward_shares`` answers "does this estimator let a reward drown?" from the
same arrays the step already has (rewards [N, K], group ids, advantages), for
any estimator, inside the compiled step.

Definition (within-group squared correlation). For reward k let
``c_k,ij = r_k,ij - mean_j r_k,i.`` (centred within its group over the rows
where reward k is scorable) and ``a_ij = A_ij - mean_j A_i.`` (the advantage
centred within its group). Then

    share_k = (sum_ij a_ij c_k,ij)^2 / (sum_ij a_ij^2 * sum_ij c_k,ij^2)

over all valid rows of the (global) batch: the fraction of the advantage's
within-group variance that reward k's within-group variation explains on its
own (R^2 of regressing a on c_k). Why this choice:

* it needs no knowledge of the estimator, so GRPO, GRPO w/o std and GDPO are
  measured with one ruler;
* it is invariant to the scale and offset of reward k and of A: a {0, 1}
  format reward and a [-3, 3] correctness reward are compared on equal terms,
  and GDPO's batch whitening does not change it;
* the policy gradient moves reward k's expectation in proportion to
  ``sum a * c_k``; the squared correlation is that covariance normalised;
* when the rewards are uncorrelated within groups and A is one linear
  combination of them in every group (GDPO when each reward's within-group
  std is the same in every group; GRPO within one group), the shares add up
  to 1 (Pythagoras); correlated rewards can add up to more, and per-group
  scales (GDPO's 1/std of each reward per group, GRPO's 1/std_i, NaN holes)
  to less. Centring A within its group removes GDPO's batch-mean shift, which
  no reward explains.

Hand-worked cases (tests/test_diagnostics.py): a reward constant in every
group has share 0; with two independent rewards, GRPO on the sum gives the
[-3, 3] reward ~0.9+ and the {0, 1} reward the rest, GDPO gives both ~0.5.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gdpo_jax.core import segment as seg
from gdpo_jax.core.advantages import _group_normalize
from gdpo_jax.core.rows import check_group_ids as _check_group_ids
from gdpo_jax.core.rows import check_num_groups as _check_num_groups
from gdpo_jax.core.rows import check_valid as _check_valid
from gdpo_jax.core.rows import row_mask as _row_mask

__all__ = ["reward_shares"]


def reward_shares(
    rewards: jax.Array,
    adv: jax.Array,
    group_ids: jax.Array,
    *,
    num_groups: int,
    valid: jax.Array | None = None,
) -> jax.Array:
    """Share of the advantage's within-group variance explained by each reward.

    Args:
      rewards: f32[N, K] rewards as the estimator read them (`advantages.rewards_as_read`:
        GRPO's sum reads an unscorable entry as 0); a NaN or +/-inf left here is
        unscorable: out of reward k's group mean, contributing 0.
      adv: f32[N] final advantages (any estimator).
      group_ids: i32[N]; ids outside [0, num_groups) count as invalid.
      num_groups: static number of groups.
      valid: bool[N] rows that take part (default all).
    Returns:
      f32[K] in [0, 1]; 0 for a reward with no within-group spread, or when the
      advantage is 0 everywhere (never NaN).
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    adv = jnp.asarray(adv, jnp.float32)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be rank 2, [N, K]; got shape {tuple(rewards.shape)}.")
    n = rewards.shape[0]
    if adv.shape != (n,):
        raise ValueError(f"adv must have shape [N] = ({n},); got {tuple(adv.shape)}.")
    num_groups = _check_num_groups(num_groups)
    group_ids = _check_group_ids(group_ids, n)
    valid = _check_valid(valid, n)
    rows = seg.explicit_rows(rewards)
    group_ids, valid = seg.match_rows(group_ids, rows), seg.match_rows(valid, rows)
    adv = seg.match_rows(adv, rows)
    row_ok = _row_mask(group_ids, valid, num_groups)
    ids = jnp.where(row_ok, group_ids, 0)
    scorable = row_ok[:, None] & jnp.isfinite(rewards)
    # Centre only (scale=False): groups with < 2 scorable rows give 0.
    c = _group_normalize(rewards, scorable, ids, num_groups, eps=0.0, scale=False, rows=rows)
    a_ok = row_ok[:, None] & jnp.isfinite(adv)[:, None]
    a = _group_normalize(adv[:, None], a_ok, ids, num_groups, eps=0.0, scale=False, rows=rows)
    cov = jnp.sum(a * c, axis=0)
    saa = jnp.sum(a * a)
    scc = jnp.sum(c * c, axis=0)
    # No floor: centring subtracts each group's max first, so a constant group centres
    # to exactly 0. An absolute floor set a share of rewards (or advantages) on a small
    # scale to 0, against the scale invariance above; the two roots keep saa * scc from
    # underflowing in f32.
    ok = (saa > 0) & (scc > 0)
    corr = cov / jnp.where(ok, jnp.sqrt(saa) * jnp.sqrt(scc), 1.0)
    return jnp.clip(jnp.where(ok, corr * corr, 0.0), 0.0, 1.0)
