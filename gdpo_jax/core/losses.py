"""Clipped policy-gradient surrogate, KL penalties and loss aggregations.

Every reduction returns a ``(sum, denom)`` pair so that ``loss = sum / denom``
and summing sums and denominators over micro-batches, devices or hosts gives
exactly the full-batch value (Tunix-style). Conventions follow verl's
``core_algos`` (dual clip, k3 clamping, ratio clamping) and TRL's clip metrics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "aggregate",
    "kl_penalty",
    "policy_loss",
    "safe_div",
    "sequence_kl",
]

AGGREGATIONS = ("grpo", "bnpo", "dapo", "dr_grpo")
KL_ESTIMATORS = ("k1", "k3", "mse")
_KL_ALIASES = {"low_var_kl": "k3", "kl": "k1"}
# verl clamps log-ratios before exp and k3 after it: one wild token (e.g. a
# sampler/trainer mismatch) must not turn the loss into inf/NaN.
_LOG_RATIO_CLAMP = 20.0
_K3_CLAMP = 10.0

Pair = tuple[jax.Array, jax.Array]


def safe_div(total: jax.Array, denom: jax.Array) -> jax.Array:
    """``total / denom``, 0 where ``denom == 0`` (an empty batch has zero loss)."""
    return jnp.where(denom > 0, total / jnp.where(denom > 0, denom, 1.0), 0.0)


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, estimator: str = "k3") -> jax.Array:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi.

    Args:
      logp: f32[B, T] log-probs of the sampled tokens under the policy.
      ref_logp: f32[B, T] the same under the frozen reference.
      estimator: "k1" (logp - ref_logp), "k3" a.k.a. "low_var_kl"
        (exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10] as verl),
        or "mse" (0.5 * (logp - ref_logp)^2).
    Returns:
      f32[B, T].
    """
    est = _KL_ALIASES.get(estimator, estimator)
    if est not in KL_ESTIMATORS:
        raise ValueError(
            f"unknown kl_estimator {estimator!r}; choose one of "
            f"{KL_ESTIMATORS} (aliases: {sorted(_KL_ALIASES)})."
        )
    logp = jnp.asarray(logp, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp and ref_logp shapes differ: {logp.shape} vs {ref_logp.shape}.")
    if est == "k1":
        return logp - ref_logp
    if est == "mse":
        return 0.5 * jnp.square(logp - ref_logp)
    log_ratio = jnp.clip(ref_logp - logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -_K3_CLAMP, _K3_CLAMP)


def sequence_kl(
    logp: jax.Array, ref_logp: jax.Array, mask: jax.Array, estimator: str = "k1"
) -> jax.Array:
    """Summed per-token KL estimate of each sequence: f32[N] (KL-in-reward penalty) from
    logp, ref_logp: f32[N, T] and mask: [N, T]; `estimator` as `core.kl_penalty` (k1 /
    k3 / mse). A select, not a product, so a non-finite log-prob at a masked position
    cannot turn the row's penalty into NaN (which the advantages would then take as no
    penalty)."""
    return jnp.sum(jnp.where(mask > 0, kl_penalty(logp, ref_logp, estimator), 0.0), axis=-1)


def aggregate(
    per_token: jax.Array,
    mask: jax.Array,
    mode: str,
    *,
    max_len: int | None = None,
    row_valid: jax.Array | None = None,
) -> Pair:
    """Reduces a per-token quantity to ``(sum, denom)``; ``loss = sum / denom``.

    The step sums the pairs of its micro-batches (and devices), so ``denom``
    decides what one micro-batch weighs in the mini-batch loss. With
    m = masked tokens, ``x`` = per_token, rows b, micro-batches u:

    * "grpo": (sum_b mean_t x_bt over row b's tokens, rows with >= 1 token).
      Mini-batch loss = mean over rows of the row means.
    * "dapo": (sum_bt x_bt, token count). Summed over micro-batches: token
      sum over the *global* token count of the mini-batch (DAPO, verl's
      "token-mean").
    * "bnpo": (sum_bt x_bt / token count, 1), (0, 0) for a micro-batch with no
      token. Mini-batch loss = mean over (non-empty) micro-batches of each
      micro-batch's token mean, as TRL's "bnpo" (normalized per micro-batch,
      then averaged by gradient accumulation). Equal to "dapo" with one
      micro-batch or equal token counts.
    * "dr_grpo": (sum_bt x_bt, valid rows * max_len) (Dr. GRPO's constant
      normalizer). Invalid rows (batch padding) are not counted.

    Args:
      per_token: f32[B, T].
      mask: f32[B, T] (or bool) 1 on response tokens that count.
      mode: one of AGGREGATIONS, see above.
      max_len: "dr_grpo" constant length (default T, the padded length).
      row_valid: bool[B] rows that exist (default all); "dr_grpo" counts only
        these in its denominator (the other modes count tokens / rows with
        tokens, so padding rows, whose mask is 0, drop out by themselves).
    Returns:
      (sum f32[], denom f32[]).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGGREGATIONS}.")
    per_token = jnp.asarray(per_token, jnp.float32)
    mask = jnp.asarray(mask).astype(jnp.float32)
    if per_token.ndim != 2 or per_token.shape != mask.shape:
        raise ValueError(
            f"per_token and mask must both be [B, T]; got "
            f"{tuple(per_token.shape)} and {tuple(mask.shape)}."
        )
    b, t = per_token.shape
    if row_valid is not None:
        row_valid = jnp.asarray(row_valid)
        if row_valid.shape != (b,):
            raise ValueError(f"row_valid must have shape [B]=[{b}]; got {tuple(row_valid.shape)}.")
    # where, not multiply: masked-out positions may hold inf/NaN garbage.
    masked = jnp.where(mask > 0, per_token * mask, 0.0)
    if mode == "grpo":
        row_tokens = jnp.sum(mask, axis=1)
        row_mean = jnp.sum(masked, axis=1) / jnp.maximum(row_tokens, 1e-8)
        has = row_tokens > 0
        return (jnp.sum(jnp.where(has, row_mean, 0.0)), jnp.sum(has).astype(jnp.float32))
    if mode == "dapo":
        return jnp.sum(masked), jnp.sum(mask)
    if mode == "bnpo":
        count = jnp.sum(mask)
        return safe_div(jnp.sum(masked), count), (count > 0).astype(jnp.float32)
    length = t if max_len is None else int(max_len)
    if length < 1:
        raise ValueError(f"max_len must be >= 1; got {max_len}.")
    rows = b if row_valid is None else jnp.sum(row_valid.astype(jnp.float32))
    return jnp.sum(masked), jnp.asarray(rows * length, jnp.float32)


def _token_mean(x: jax.Array, mask: jax.Array) -> Pair:
    return jnp.sum(jnp.where(mask > 0, x * mask, 0.0)), jnp.sum(mask)


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ref_logp: jax.Array | None = None,
    beta: float = 0.0,
    kl_estimator: str = "k3",
    entropy: jax.Array | None = None,
    entropy_coef: float = 0.0,
    aggregation: str = "grpo",
    max_len: int | None = None,
    row_valid: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, Pair]]:
    """PPO/GRPO clipped surrogate (+ KL to a reference, - entropy bonus).

    Per token, with rho = exp(logp - old_logp):
      pg = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high))
      if dual_clip (> 1) and A < 0: pg = min(pg, -A * dual_clip)
      loss = pg + beta * KL(logp, ref_logp) - entropy_coef * entropy

    Args:
      logp: f32[B, T] current policy log-probs of the sampled tokens.
      old_logp: f32[B, T] behaviour (rollout-time) log-probs; treated as data.
      advantages: f32[B] (one per sequence) or f32[B, T] (per token).
      mask: f32[B, T] response-token mask. At masked positions old_logp,
        ref_logp and entropy may hold anything (NaN, inf): it reaches neither
        the loss nor its gradient.
      clip_low / clip_high: ratio clip range (clip-higher when different).
      dual_clip: verl's clip_ratio_c (> 1) for negative advantages; None = off.
      ref_logp: f32[B, T] reference log-probs (needed when beta != 0).
      beta: KL coefficient; kl_estimator: see ``kl_penalty``.
      entropy: f32[B, T] policy entropy (needed when entropy_coef != 0).
      aggregation / max_len / row_valid: see ``aggregate``.
    Returns:
      (loss_sum f32[], denom f32[], metrics): metrics maps name -> (sum, denom)
      pairs: pg_loss (same aggregation as the loss), token means clip_frac_low,
      clip_frac_high, clip_frac, clip_frac_dual (with dual_clip), approx_kl
      (k3 of old vs new), kl (if ref_logp), entropy (if given), ratio_mean; and
      ratio_max / ratio_min as (value, has tokens): value 1 and 0 when the mask is
      empty (combine those with max/min over the pairs whose second entry is 1,
      not sum: an empty micro-batch's 1 is no ratio).
    """
    logp = jnp.asarray(logp, jnp.float32)
    old_logp = jnp.asarray(old_logp, jnp.float32)
    mask = jnp.asarray(mask).astype(jnp.float32)
    advantages = jnp.asarray(advantages, jnp.float32)
    if logp.ndim != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp, old_logp and mask must all be [B, T]; got "
            f"{tuple(logp.shape)}, {tuple(old_logp.shape)}, {tuple(mask.shape)}."
        )
    if advantages.shape == logp.shape[:1]:
        adv = advantages[:, None]
    elif advantages.shape == logp.shape:
        adv = advantages
    else:
        raise ValueError(
            f"advantages must be [B]={logp.shape[:1]} or [B, T]={logp.shape}; "
            f"got {tuple(advantages.shape)}."
        )
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(
            f"clip_low must be in [0, 1) (ratio floor 1 - clip_low > 0); got {clip_low}."
        )
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0; got {clip_high}.")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip (verl clip_ratio_c) must be > 1; got {dual_clip}.")
    if beta != 0.0 and ref_logp is None:
        raise ValueError("beta != 0 needs ref_logp (reference-policy log-probs).")
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs entropy (e.g. from token_entropy).")

    # Masked positions may hold garbage (NaN, -inf). `aggregate`'s where keeps it out of
    # the value, not the gradient: a zero cotangent times a NaN derivative is NaN, on
    # every parameter. So masked positions take the policy's own log-prob first.
    on = mask > 0
    sg_logp = jax.lax.stop_gradient(logp)
    old_logp = jnp.where(on, jax.lax.stop_gradient(old_logp), sg_logp)
    if ref_logp is not None:
        ref_logp = jnp.where(on, jnp.asarray(ref_logp, jnp.float32), sg_logp)
    log_ratio = jnp.clip(logp - old_logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = jnp.maximum(pg_unclipped, pg_clipped)
    # Where clipping is active (gradient zero), as TRL reports it.
    low = (ratio < 1.0 - clip_low) & (adv < 0)
    high = (ratio > 1.0 + clip_high) & (adv > 0)
    metrics: dict[str, Pair] = {
        "clip_frac_low": _token_mean(low.astype(jnp.float32), mask),
        "clip_frac_high": _token_mean(high.astype(jnp.float32), mask),
        "clip_frac": _token_mean((low | high).astype(jnp.float32), mask),
    }
    if dual_clip is not None:
        pg_dual = -adv * dual_clip
        dual = (adv < 0) & (pg_dual < pg)
        pg = jnp.where(adv < 0, jnp.minimum(pg, pg_dual), pg)
        metrics["clip_frac_dual"] = _token_mean(dual.astype(jnp.float32), mask)
    metrics["pg_loss"] = aggregate(pg, mask, aggregation, max_len=max_len, row_valid=row_valid)

    per_token = pg
    if ref_logp is not None:
        kl = kl_penalty(logp, ref_logp, kl_estimator)
        metrics["kl"] = _token_mean(kl, mask)
        if beta != 0.0:
            per_token = per_token + beta * kl
    if entropy is not None:
        entropy = jnp.asarray(entropy, jnp.float32)
        if entropy.shape != logp.shape:
            raise ValueError(f"entropy must be [B, T]={logp.shape}; got {tuple(entropy.shape)}.")
        entropy = jnp.where(on, entropy, 0.0)
        metrics["entropy"] = _token_mean(jax.lax.stop_gradient(entropy), mask)
        if entropy_coef != 0.0:
            per_token = per_token - entropy_coef * entropy

    sg_log_ratio = jax.lax.stop_gradient(log_ratio)
    sg_ratio = jax.lax.stop_gradient(ratio)
    # k3 estimate of KL(old || new) from old samples: (rho - 1) - log rho.
    metrics["approx_kl"] = _token_mean(sg_ratio - 1.0 - sg_log_ratio, mask)
    metrics["ratio_mean"] = _token_mean(sg_ratio, mask)
    any_on = jnp.any(on)
    has = any_on.astype(jnp.float32)
    metrics["ratio_max"] = (jnp.where(any_on, jnp.max(jnp.where(on, sg_ratio, -jnp.inf)), 1.0), has)
    metrics["ratio_min"] = (jnp.where(any_on, jnp.min(jnp.where(on, sg_ratio, jnp.inf)), 1.0), has)
    metrics["pg_loss"] = tuple(jax.lax.stop_gradient(v) for v in metrics["pg_loss"])
    if "kl" in metrics:
        metrics["kl"] = tuple(jax.lax.stop_gradient(v) for v in metrics["kl"])

    loss_sum, denom = aggregate(per_token, mask, aggregation, max_len=max_len, row_valid=row_valid)
    return loss_sum, denom, metrics
