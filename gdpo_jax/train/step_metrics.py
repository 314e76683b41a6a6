"""The RL step's logged metrics, reduced over micro-batches, mini-batches and epochs.

Loss terms (`pg_loss`, `kl`, `entropy`, the clip fractions, ...) travel as (sum,
denominator) pairs, so each is a mean over the tokens (or rows) of the whole batch, never a
mean of means; `*_min` / `*_max` travel as (value, has tokens) pairs. `loss` and
`grad_norm` are each update's own objective and gradient norm, averaged over the updates
that had tokens (as TRL's and verl's logs average theirs): with several mini-batches of
unequal token (or row) counts, `loss` is not `pg_loss` + beta * `kl`. `step_metrics` adds
the advantage diagnostics (adv/*, the per-reward shares of core/diagnostics.py) on the
global batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from gdpo_jax.core.advantages import group_distinct_advantages
from gdpo_jax.core.diagnostics import reward_shares

__all__ = ["combine_pairs", "step_metrics"]


def combine_pairs(a: dict, b: dict) -> dict:
    """Adds (sum, denom) metric pairs; *_min / *_max keys, (value, has tokens) pairs,
    combine by min / max over the parts that have tokens (an empty micro-batch, e.g.
    only dynamic sampling's padding groups, reports 1.0, which is no ratio)."""
    out = {}
    for k in a:
        (sa, da), (sb, db) = a[k], b[k]
        if k.endswith(("_min", "_max")):
            both = (jnp.minimum if k.endswith("_min") else jnp.maximum)(sa, sb)
            out[k] = (jnp.where(db > 0, jnp.where(da > 0, both, sb), sa), jnp.maximum(da, db))
        else:
            out[k] = (sa + sb, da + db)
    return out


def _reduce(pairs: dict) -> dict[str, jax.Array]:
    """Pairs with leading [E, U] (epochs, updates) -> one scalar each, as micro-batches
    combine: sums over sums; min / max over the updates that had tokens, else 1."""
    out = {}
    for k, (s, d) in pairs.items():
        s, d = s.reshape(-1), d.reshape(-1)
        if k.endswith(("_min", "_max")):
            lo = k.endswith("_min")
            pick = jnp.where(d > 0, s, jnp.inf if lo else -jnp.inf)
            out[k] = jnp.where(jnp.any(d > 0), jnp.min(pick) if lo else jnp.max(pick), 1.0)
        else:
            out[k] = jnp.sum(s) / jnp.maximum(jnp.sum(d), 1e-12)
    return out


def step_metrics(
    pairs: dict,
    losses: jax.Array,
    grad_norms: jax.Array,
    kept: jax.Array,
    *,
    adv: jax.Array,
    rewards: jax.Array,
    batch: dict[str, jax.Array],
    cfg: Any,
    lr: jax.Array,
    seq_kl: jax.Array | None,
) -> dict[str, jax.Array]:
    """Scalar metrics of one step.

    pairs: the loss terms' (sum, denom) pairs, leading [E, U]; losses, grad_norms,
    kept: f32/bool[E, U] per update (kept: the update had tokens); adv f32[N] the
    advantages; rewards f32[N, K] as the estimator read them (`rewards_as_read`);
    batch: valid bool[N], group_ids i32[N]; cfg: the StepConfig (num_groups,
    reward_names); lr: the schedule's value at the step's first update; seq_kl f32[N]
    or None. A step with no valid row (dynamic sampling kept no group) logs NaN for
    everything but lr, as the rollout's reward means: a 0 was averaged into the
    plotted curves and the studies' share means.
    """
    kept = kept.astype(jnp.float32)
    # Over the updates that had tokens: a mini-batch of padding groups only (dynamic
    # sampling) makes no update, and its 0 loss and 0 norm halved the mean of two.
    n_kept = jnp.maximum(jnp.sum(kept), 1.0)
    metrics = _reduce(pairs)
    valid = batch["valid"].astype(jnp.float32)
    n_valid = jnp.maximum(jnp.sum(valid), 1.0)
    adv_mean = jnp.sum(adv * valid) / n_valid
    metrics.update(
        {
            "loss": jnp.sum(losses * kept) / n_kept,
            "grad_norm": jnp.sum(grad_norms * kept) / n_kept,
            "adv/mean": adv_mean,
            "adv/std": jnp.sqrt(jnp.sum(((adv - adv_mean) ** 2) * valid) / n_valid),
            "adv/distinct_per_group": group_distinct_advantages(
                adv, batch["group_ids"], num_groups=cfg.num_groups, valid=batch["valid"]
            ),
        }
    )
    # Which reward the advantage follows (core/diagnostics.py): one scalar per reward.
    shares = reward_shares(
        rewards, adv, batch["group_ids"], num_groups=cfg.num_groups, valid=batch["valid"]
    )
    for k, name in enumerate(_reward_names(cfg.reward_names, rewards.shape[1])):
        metrics[f"adv/share/{name}"] = shares[k]
    if seq_kl is not None:
        metrics["kl_in_reward"] = jnp.sum(seq_kl) / n_valid
    empty = jnp.sum(valid) == 0
    metrics = {k: jnp.where(empty, jnp.nan, v) for k, v in metrics.items()}
    metrics["lr"] = jnp.asarray(lr, jnp.float32)
    return metrics


def _reward_names(names: Sequence[str] | None, k: int) -> tuple[str, ...]:
    """The reward columns' metric names: cfg.reward_names, else the column indices."""
    if names and len(names) == k:
        return tuple(names)
    return tuple(str(i) for i in range(k))
