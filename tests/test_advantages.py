"""compute_advantages & friends against an independent NumPy reference.

The reference below loops over groups and rows in plain Python/float64; it
shares no code with gdpo_jax.core. Shapes are fixed (N=40, 12 groups) so the
eager/jitted kernels compile once per K.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache, partial

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax.core import (
    ESTIMATORS,
    compute_advantages,
    gate_reward,
    group_distinct_advantages,
    per_reward_group_spread,
)

N, G = 40, 12
TOL = dict(rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- #
# Independent reference (float64, explicit loops).
# --------------------------------------------------------------------------- #
def _normalize(values: dict[int, float], eps: float, scale: bool) -> dict[int, float]:
    """values: row -> value for one group (scorable rows only)."""
    if len(values) < 2:
        return {i: 0.0 for i in values}
    vals = list(values.values())
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
    out = {}
    for i, v in values.items():
        if not scale:
            out[i] = v - mean
        else:
            out[i] = (v - mean) / (std + eps) if std + eps > 0 else 0.0
    return out


def ref_advantages(
    rewards,
    group_ids,
    num_groups,
    estimator,
    weights=None,
    valid=None,
    eps=1e-4,
    batch_norm="sample",
    token_counts=None,
):
    r = np.asarray(rewards, np.float64)
    n, k = r.shape
    w = np.ones(k) if weights is None else np.asarray(weights, np.float64)
    ok = [(valid is None or bool(valid[i])) and 0 <= group_ids[i] < num_groups for i in range(n)]
    out = np.zeros(n)
    if estimator in ("grpo", "grpo_no_std"):
        s = [
            sum(w[j] * (0.0 if np.isnan(r[i, j]) else r[i, j]) for j in range(k)) for i in range(n)
        ]
        for g in range(num_groups):
            members = {i: s[i] for i in range(n) if ok[i] and group_ids[i] == g}
            for i, a in _normalize(members, eps, estimator == "grpo").items():
                out[i] = a
        return out
    total = np.zeros(n)
    for j in range(k):
        for g in range(num_groups):
            members = {
                i: r[i, j]
                for i in range(n)
                if ok[i] and group_ids[i] == g and not np.isnan(r[i, j])
            }
            for i, a in _normalize(members, eps, True).items():
                total[i] += w[j] * a
    if estimator == "gdpo_no_bn":
        return np.where(ok, total, 0.0)
    # The batch whitening: rows with at least one scorable reward (TRL main).
    rows = [i for i in range(n) if ok[i] and not np.isnan(r[i]).all()]
    if batch_norm == "sample":
        vals = [total[i] for i in rows]
        mean = sum(vals) / max(len(vals), 1)
        std = 0.0
        if len(vals) > 1:
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in rows:
            out[i] = (total[i] - mean) / (std + eps) if std + eps > 0 else 0.0
        return out
    # verl masked_whiten on the [N, T] token matrix (advantage broadcast to tokens).
    tmax = int(max(token_counts)) + 1
    tok = np.zeros((n, tmax))
    msk = np.zeros((n, tmax))
    for i in rows:
        tok[i, :] = total[i]
        msk[i, : token_counts[i]] = 1.0
    msum = msk.sum()
    mean = (tok * msk).sum() / msum
    var = (((tok - mean) ** 2) * msk).sum() / msum * (msum / (msum - 1))
    for i in rows:
        # A row without response tokens has no token to carry an advantage: 0.
        out[i] = (total[i] - mean) / math.sqrt(var + 1e-8) if token_counts[i] else 0.0
    return out


def make_case(seed: int, k: int, *, nan_p=0.1, pad_p=0.15, weighted=True):
    """Ragged, non-contiguous groups; a size-1 group; constant groups; NaN; padding."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(G - 1, 0.7))
    ids = rng.choice(G - 1, size=N, p=probs)
    ids[0] = G - 1  # exactly one row in the last group
    perm = rng.permutation(N)
    ids = ids[perm].astype(np.int32)
    cols = []
    for _ in range(k):
        kind = rng.integers(3)
        if kind == 0:
            col = rng.integers(0, 2, N).astype(np.float64)
        elif kind == 1:
            col = rng.integers(-3, 4, N).astype(np.float64)
        else:
            col = rng.normal(rng.uniform(-1, 1), rng.uniform(0.5, 3.0), N)
        cols.append(col)
    r = np.stack(cols, 1).astype(np.float32)
    for g in rng.choice(G - 1, size=3, replace=False):  # constant (group, reward)
        j = rng.integers(k)
        r[ids == g, j] = np.float32(rng.normal())
    r[rng.random((N, k)) < nan_p] = np.nan
    valid = rng.random(N) > pad_p
    ids = np.where(~valid & (rng.random(N) < 0.5), -1, ids).astype(np.int32)  # -1 padding ids
    w = rng.uniform(0.2, 2.0, k).astype(np.float32) if weighted else np.ones(k, np.float32)
    tc = rng.integers(0, 25, N).astype(np.int32)
    return r, ids, w, valid, tc


_JIT_CACHE: dict = {}


def jitted(estimator: str, batch_norm: str = "sample", eps: float = 1e-4):
    key = (estimator, batch_norm, eps)
    if key not in _JIT_CACHE:
        _JIT_CACHE[key] = jax.jit(
            partial(
                compute_advantages,
                num_groups=G,
                estimator=estimator,
                batch_norm=batch_norm,
                eps=eps,
            )
        )
    return _JIT_CACHE[key]


def adv_fn(r, ids, **kwargs):
    """One compiled call (cheaper than eager op-by-op dispatch for a new shape); one
    jitted function per set of static arguments, so a repeated shape is not traced and
    compiled again."""
    static = tuple(
        (k, kwargs.pop(k))
        for k in ("num_groups", "estimator", "eps", "batch_norm", "nan_rewards")
        if k in kwargs
    )
    return _jitted(static)(r, ids, **kwargs)


@cache
def _jitted(static: tuple) -> Callable:
    return jax.jit(partial(compute_advantages, **dict(static)))


# --------------------------------------------------------------------------- #
# Against the reference.
# --------------------------------------------------------------------------- #
VARIANTS = [(e, "sample") for e in ESTIMATORS] + [("gdpo", "token")]


@pytest.mark.parametrize("estimator,batch_norm", VARIANTS)
def test_matches_reference_jitted(estimator, batch_norm):
    f = jitted(estimator, batch_norm)
    for seed in range(8):
        k = 1 + seed % 3 * 2  # K in {1, 3, 5}: three compilations per variant
        r, ids, w, valid, tc = make_case(seed, k)
        got = f(r, ids, weights=w, valid=valid, token_counts=tc)
        want = ref_advantages(
            r, ids, G, estimator, w, valid, batch_norm=batch_norm, token_counts=tc
        )
        np.testing.assert_allclose(np.asarray(got), want, **TOL, err_msg=f"seed {seed}")
        assert got.dtype == jnp.float32


K_MAX = 5


def pad_columns(r, w):
    """Pads K up to K_MAX with all-NaN columns: a no-op for every estimator
    (test_nan_column_is_a_no_op...), so property examples of any K share one
    compilation per estimator."""
    k = r.shape[1]
    r = np.concatenate([r, np.full((r.shape[0], K_MAX - k), np.nan, np.float32)], 1)
    return r, np.concatenate([w, np.zeros(K_MAX - k, np.float32)])


@hypothesis.settings(max_examples=30, deadline=None, derandomize=True)
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    k=st.integers(1, 5),
    estimator=st.sampled_from(ESTIMATORS),
    nan_p=st.sampled_from([0.0, 0.1, 0.5]),
    pad_p=st.sampled_from([0.0, 0.2]),
    weighted=st.booleans(),
)
def test_property_matches_reference(seed, k, estimator, nan_p, pad_p, weighted):
    r, ids, w, valid, _ = make_case(seed, k, nan_p=nan_p, pad_p=pad_p, weighted=weighted)
    rp, wp = pad_columns(r, w)
    got = np.asarray(jitted(estimator)(rp, ids, weights=wp, valid=valid))
    want = ref_advantages(r, ids, G, estimator, w, valid)
    np.testing.assert_allclose(got, want, **TOL)
    assert np.all(np.isfinite(got))


def test_defaults_and_trl_patch_layout():
    """Equal contiguous groups, no NaN: the official TRL patch's reshape formula."""
    rng = np.random.default_rng(1)
    g, size, k = 10, 4, 3
    r = rng.integers(0, 2, (g * size, k)).astype(np.float32)
    ids = np.repeat(np.arange(g), size).astype(np.int32)
    # The TRL patch: per reward view(-1, G), mean/std(ddof=1), (r - m)/(s + 1e-4),
    # weighted sum, then (x - mean)/(std + 1e-4) over the batch.
    x = r.astype(np.float64).reshape(g, size, k)
    a = (x - x.mean(1, keepdims=True)) / (x.std(1, ddof=1, keepdims=True) + 1e-4)
    pre = a.sum(-1).reshape(-1)
    want = (pre - pre.mean()) / (pre.std(ddof=1) + 1e-4)
    got = adv_fn(r, ids, num_groups=g)  # defaults: gdpo, weights 1, all valid
    np.testing.assert_allclose(np.asarray(got), want, **TOL)
    s = x.sum(-1)
    want_grpo = (s - s.mean(1, keepdims=True)) / (s.std(1, ddof=1, keepdims=True) + 1e-4)
    want_grpo = want_grpo.reshape(-1)
    got_grpo = adv_fn(r, ids, num_groups=g, estimator="grpo")
    np.testing.assert_allclose(np.asarray(got_grpo), want_grpo, **TOL)


def test_hand_worked_two_rewards_two_rollouts():
    # Group 0: (1,0) vs (0,1): each reward +-1/sqrt(2) with opposite signs -> sum 0.
    # Group 1: (1,1) vs (0,0): both rewards agree -> +-sqrt(2). GRPO sees sums 1,1 and 2,0.
    r = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], np.float32)
    ids = np.array([0, 0, 1, 1], np.int32)
    h = 1 / (math.sqrt(0.5) + 1e-4)  # two rewards x (1 - 0.5) / (std + eps), std = sqrt(.5)
    no_bn = adv_fn(r, ids, num_groups=2, estimator="gdpo_no_bn")
    np.testing.assert_allclose(no_bn, [0, 0, h, -h], **TOL)
    grpo = adv_fn(r, ids, num_groups=2, estimator="grpo")
    q = 1 / (math.sqrt(2) + 1e-4)  # sums 2 vs 0: (2 - 1) / (sqrt(2) + eps)
    np.testing.assert_allclose(grpo, [0, 0, q, -q], **TOL)
    gdpo = adv_fn(r, ids, num_groups=2, estimator="gdpo")
    std = math.sqrt((2 * h * h) / 3)  # batch values 0, 0, h, -h: mean 0, ddof=1
    np.testing.assert_allclose(gdpo, [0, 0, h / (std + 1e-4), -h / (std + 1e-4)], **TOL)


def test_nan_size_one_constant_and_padding_rules():
    r = np.array([[1.0, np.nan], [0.0, 2.0], [5.0, 2.0], [3.0, 3.0], [7.0, 1.0]], np.float32)
    ids = np.array([0, 0, 0, 1, -1], np.int32)
    adv = adv_fn(r, ids, num_groups=2, estimator="gdpo_no_bn")
    # reward 0 in group 0: values 1, 0, 5; reward 1: NaN left out -> values 2, 2 constant -> 0.
    m, s = 2.0, math.sqrt(((1 - 2) ** 2 + (0 - 2) ** 2 + (5 - 2) ** 2) / 2)
    want = [(1 - m) / (s + 1e-4), (0 - m) / (s + 1e-4), (5 - m) / (s + 1e-4), 0.0, 0.0]
    np.testing.assert_allclose(adv, want, **TOL)
    # Constant groups give exactly 0, not rounding noise / eps.
    r2 = np.full((6, 1), 2.9, np.float32)  # float32 sum(6 x 2.9) / 6 != 2.9
    for est in ESTIMATORS:
        out = adv_fn(r2, np.zeros(6, np.int32), num_groups=1, estimator=est)
        assert np.all(np.asarray(out) == 0.0), est
    # eps = 0 (NeMo-RL): constant and size-1 groups give 0, never NaN.
    r3 = np.array([[1.0], [1.0], [0.0], [1.0]], np.float32)
    out = adv_fn(r3, np.array([0, 0, 1, 2], np.int32), num_groups=3, estimator="grpo", eps=0.0)
    np.testing.assert_array_equal(out, [0, 0, 0, 0])


# --------------------------------------------------------------------------- #
# Invariances.
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("estimator", ["grpo", "gdpo"])
def test_row_permutation(estimator):
    r, ids, w, valid, _ = make_case(11, 3)
    perm = np.random.default_rng(0).permutation(N)
    f = jitted(estimator)
    a = np.asarray(f(r, ids, weights=w, valid=valid))
    b = np.asarray(f(r[perm], ids[perm], weights=w, valid=valid[perm]))
    np.testing.assert_allclose(b, a[perm], rtol=1e-5, atol=1e-5)


def test_gdpo_invariant_to_scale_and_shift_of_one_reward():
    r, ids, w, valid, _ = make_case(12, 3, nan_p=0.1)
    f = jitted("gdpo", eps=1e-6)
    base = np.asarray(f(r, ids, weights=w, valid=valid))
    for j, scale, shift in [(0, 3.0, -2.0), (1, 0.25, 5.0), (2, 1.0, 10.0)]:
        r2 = r.copy()
        r2[:, j] = r2[:, j] * scale + shift
        got = np.asarray(f(r2, ids, weights=w, valid=valid))
        np.testing.assert_allclose(got, base, rtol=1e-3, atol=1e-3)
    # GRPO is not invariant (sanity: the test can fail).
    g = jitted("grpo", eps=1e-6)
    r2 = r.copy()
    r2[:, 0] *= 3.0
    assert not np.allclose(
        g(r2, ids, weights=w, valid=valid), g(r, ids, weights=w, valid=valid), atol=1e-2
    )


def test_k1_gdpo_is_grpo_then_whitening():
    # Without NaN (GRPO counts NaN as 0, GDPO leaves it out, so they differ there).
    r, ids, _, valid, _ = make_case(13, 1, nan_p=0.0)
    grpo = np.asarray(jitted("grpo")(r, ids, valid=valid), np.float64)
    gdpo = np.asarray(jitted("gdpo")(r, ids, valid=valid))
    rows = valid & (ids >= 0)
    x = grpo[rows]
    want = np.zeros(N)
    want[rows] = (x - x.mean()) / (x.std(ddof=1) + 1e-4)
    np.testing.assert_allclose(gdpo, want, **TOL)


def test_nan_column_is_a_no_op_for_gdpo_and_zero_weight_for_grpo():
    # Two all-NaN columns with non-zero weight: GDPO leaves them out, GRPO counts them as 0.
    # (K = 3 and 5 reuse the compilations of the reference tests.)
    r, ids, w, valid, _ = make_case(14, 3)
    r5 = np.concatenate([r, np.full((N, 2), np.nan, np.float32)], 1)
    w5 = np.concatenate([w, [0.7, 2.0]]).astype(np.float32)
    for est in ESTIMATORS:
        a = jitted(est)(r, ids, weights=w, valid=valid)
        b = jitted(est)(r5, ids, weights=w5, valid=valid)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=est)


# --------------------------------------------------------------------------- #
# Sharded == unsharded (8 fake CPU devices), Auto and Explicit meshes.
# --------------------------------------------------------------------------- #
def _everything(r, ids, w, valid, tc):
    out = {
        e: compute_advantages(r, ids, num_groups=G, estimator=e, weights=w, valid=valid)
        for e in ESTIMATORS
    }
    out["gdpo_token"] = compute_advantages(
        r, ids, num_groups=G, weights=w, valid=valid, batch_norm="token", token_counts=tc
    )
    out["distinct"] = group_distinct_advantages(out["gdpo"], ids, num_groups=G, valid=valid)
    out["spread"] = per_reward_group_spread(r, ids, num_groups=G, valid=valid)
    return out


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_sharded_equals_unsharded(axis_type):
    assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
    n = 64
    rng = np.random.default_rng(5)
    ids = rng.integers(0, G, n).astype(np.int32)
    r = rng.integers(-1, 3, (n, 3)).astype(np.float32)
    r[rng.random((n, 3)) < 0.1] = np.nan
    valid = rng.random(n) > 0.1
    tc = rng.integers(1, 30, n).astype(np.int32)
    w = np.array([1.0, 0.5, 2.0], np.float32)
    want = jax.jit(_everything)(r, ids, w, valid, tc)
    mesh = jax.make_mesh((4, 2, 1), ("data", "fsdp", "tensor"), axis_types=(axis_type,) * 3)
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    with jax.set_mesh(mesh):
        args = [
            jax.device_put(r, rows),
            jax.device_put(ids, rows),
            jax.device_put(w, NamedSharding(mesh, P())),
            jax.device_put(valid, rows),
            jax.device_put(tc, rows),
        ]
        got = jax.jit(_everything)(*args)
    for key in want:
        np.testing.assert_allclose(
            np.asarray(got[key]), np.asarray(want[key]), rtol=1e-5, atol=1e-5, err_msg=key
        )
    # The advantages stay sharded like the rows (no silent gather to one device).
    assert got["gdpo"].sharding.spec[0] == ("data", "fsdp")
    assert len(got["gdpo"].sharding.device_set) == 8


# --------------------------------------------------------------------------- #
# gate_reward, group_distinct_advantages, per_reward_group_spread.
# --------------------------------------------------------------------------- #
def test_gate_reward():
    reward = np.array([1.0, 0.5, 1.0, np.nan, 1.0], np.float32)
    cond = np.array([1.0, 1.0, 0.0, 1.0, np.nan], np.float32)
    out = np.asarray(gate_reward(reward, cond, 1.0))
    np.testing.assert_array_equal(out[:3], [1.0, 0.5, 0.0])
    assert np.isnan(out[3]) and np.isnan(out[4])
    out = gate_reward(np.ones(3), np.array([0.2, 0.5, 0.7]), 0.5)
    np.testing.assert_array_equal(out, [0, 1, 1])
    # +-inf is unscorable, as NaN: it decides no gate (it kept / zeroed the reward).
    out = np.asarray(gate_reward(np.ones(3), np.array([np.inf, -np.inf, 2.0]), 1.0))
    assert np.isnan(out[:2]).all() and out[2] == 1.0
    with pytest.raises(ValueError, match="same shape"):
        gate_reward(np.ones(3), np.ones(2), 1.0)


def _ref_distinct(adv, ids, num_groups, valid, decimals):
    counts = []
    for g in range(num_groups):
        vals = {
            round(float(adv[i]), decimals) + 0.0
            for i in range(len(adv))
            if valid[i] and ids[i] == g
        }
        if vals:
            counts.append(len(vals))
    return sum(counts) / max(len(counts), 1)


def test_group_distinct_advantages():
    adv = np.array([0.5, -0.5, 0.5, 0.0, 1.0, 2.0, 3.0, 9.0], np.float32)
    ids = np.array([0, 0, 0, 1, 2, 2, 2, 3], np.int32)
    valid = np.array([1, 1, 1, 1, 1, 1, 1, 0], bool)
    # groups: {0.5,-0.5} -> 2, {0} -> 1, {1,2,3} -> 3; group 3 invalid -> ignored
    got = group_distinct_advantages(adv, ids, num_groups=5, valid=valid)
    assert float(got) == pytest.approx(2.0)
    rng = np.random.default_rng(3)
    for _ in range(3):
        adv = rng.integers(-2, 3, N).astype(np.float32) / 4
        ids = rng.integers(0, G, N).astype(np.int32)
        valid = rng.random(N) > 0.2
        got = jax.jit(partial(group_distinct_advantages, num_groups=G))(adv, ids, valid=valid)
        assert float(got) == pytest.approx(_ref_distinct(adv, ids, G, valid, 4))


def test_per_reward_group_spread():
    r, ids, _, valid, _ = make_case(21, 3)
    got = np.asarray(per_reward_group_spread(r, ids, num_groups=G, valid=valid))
    assert got.shape == (G, 3) and got.dtype == bool
    for g in range(G):
        for j in range(3):
            vals = {
                float(r[i, j])
                for i in range(N)
                if valid[i] and ids[i] == g and not np.isnan(r[i, j])
            }
            assert got[g, j] == (len(vals) > 1), (g, j)
    # A group whose *sum* is constant still has spread in each reward.
    r2 = np.array([[1, 0], [0, 1]], np.float32)
    np.testing.assert_array_equal(
        per_reward_group_spread(r2, np.zeros(2, np.int32), num_groups=1), [[True, True]]
    )


# --------------------------------------------------------------------------- #
# Errors.
# --------------------------------------------------------------------------- #
def test_errors_name_the_problem():
    r = np.zeros((4, 2), np.float32)
    ids = np.zeros(4, np.int32)
    with pytest.raises(ValueError, match=r"weights.*\[K\]=\[2\]"):
        compute_advantages(r, ids, num_groups=1, weights=np.ones(3))
    with pytest.raises(ValueError, match="rank 2"):
        compute_advantages(np.zeros(4), ids, num_groups=1)
    with pytest.raises(ValueError, match="group_ids must have shape"):
        compute_advantages(r, np.zeros(5, np.int32), num_groups=1)
    with pytest.raises(ValueError, match="unknown estimator 'ppo'.*grpo_no_std.*gdpo_no_bn"):
        compute_advantages(r, ids, num_groups=1, estimator="ppo")
    with pytest.raises(ValueError, match="integer"):
        compute_advantages(r, ids.astype(np.float32), num_groups=1)
    with pytest.raises(ValueError, match="token_counts"):
        compute_advantages(r, ids, num_groups=1, batch_norm="token")
    with pytest.raises(ValueError, match="valid must have shape"):
        compute_advantages(r, ids, num_groups=1, valid=np.ones(3, bool))
    with pytest.raises(ValueError, match="num_groups"):
        compute_advantages(r, ids, num_groups=0)
    with pytest.raises(ValueError, match="batch_norm"):
        compute_advantages(r, ids, num_groups=1, batch_norm="tokens")


# --------------------------------------------------------------------------- #
# Hostile inputs (issue #13, item 6): inf, NaN weights, None.
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("bad", [np.inf, -np.inf])
def test_infinite_reward_is_unscorable_like_nan(estimator, bad):
    r, ids, w, valid, _ = make_case(5, 2, nan_p=0.0, pad_p=0.0)
    r_inf, r_nan = r.copy(), r.copy()
    r_inf[3, 1], r_nan[3, 1] = bad, np.nan
    got = np.asarray(adv_fn(r_inf, ids, num_groups=G, estimator=estimator, weights=w))
    assert np.all(np.isfinite(got)), "one inf reward poisoned other rows"
    want = np.asarray(adv_fn(r_nan, ids, num_groups=G, estimator=estimator, weights=w))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, ref_advantages(r_nan, ids, G, estimator, w), **TOL)


def test_infinite_reward_spread_is_ignored():
    r = np.array([[1.0], [1.0], [np.inf]], np.float32)
    spread = per_reward_group_spread(r, np.zeros(3, np.int32), num_groups=1)
    assert not bool(spread[0, 0])


def test_none_in_rewards_reads_as_nan():
    ids = np.array([0, 0, 0, 1, 1], np.int32)
    with_none = [[1.0, 0.0], [None, 1.0], [0.0, 0.5], [1.0, None], [0.0, 2.0]]
    with_nan = np.array(with_none, dtype=np.float32)
    assert np.isnan(with_nan[1, 0])
    for est in ("grpo", "gdpo"):
        np.testing.assert_array_equal(
            np.asarray(compute_advantages(with_none, ids, num_groups=2, estimator=est)),
            np.asarray(compute_advantages(with_nan, ids, num_groups=2, estimator=est)),
        )


def test_nonfinite_weights_and_bad_rewards_are_rejected_by_name():
    r = np.zeros((4, 2), np.float32)
    ids = np.zeros(4, np.int32)
    msg = r"compute_advantages: weights has a non-finite value at index 1 \(nan\); pass finite"
    with pytest.raises(ValueError, match=msg):
        compute_advantages(r, ids, num_groups=1, weights=[1.0, np.nan])
    with pytest.raises(ValueError, match=r"weights has a non-finite value at index 0 \(-inf\)"):
        compute_advantages(r, ids, num_groups=1, weights=np.array([-np.inf, 1.0]))
    with pytest.raises(ValueError, match=r"weights has a non-finite value at index 1 \(nan\)"):
        compute_advantages(r, ids, num_groups=1, weights=[1.0, None])
    with pytest.raises(ValueError, match="compute_advantages: rewards must be a numeric array"):
        compute_advantages([["a", "b"]] * 4, ids, num_groups=1)
    with pytest.raises(ValueError, match="compute_advantages: rewards must be a numeric array"):
        compute_advantages([[1.0, 2.0], [1.0]], ids[:2], num_groups=1)
    with pytest.raises(ValueError, match=r"penalty must have shape \[N\]=\[4\]"):
        compute_advantages(r, ids, num_groups=1, penalty=np.zeros(3))


# --------------------------------------------------------------------------- #
# KL-in-reward penalty (issue #13, item 1).
# --------------------------------------------------------------------------- #
def _penalty_case():
    r, ids, w, valid, _ = make_case(11, 2, nan_p=0.0, pad_p=0.0)
    kl = np.random.default_rng(0).gamma(2.0, 3.0, N).astype(np.float32)  # nats, > 0
    return r, ids, w, kl


def _ref_with_penalty(r, ids, estimator, w, pen):
    """NumPy: GRPO normalizes sum + pen per group; GDPO adds pen to S, then whitens."""
    if estimator.startswith("grpo"):
        s = (r.astype(np.float64) * w).sum(1) + pen
        return ref_advantages(s[:, None], ids, G, estimator)
    s = ref_advantages(r, ids, G, "gdpo_no_bn", w) + pen
    if estimator == "gdpo_no_bn":
        return s
    return (s - s.mean()) / (s.std(ddof=1) + 1e-4)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_penalty_matches_reference(estimator):
    r, ids, w, kl = _penalty_case()
    pen = -0.05 * kl
    got = adv_fn(r, ids, num_groups=G, estimator=estimator, weights=w, penalty=pen)
    np.testing.assert_allclose(got, _ref_with_penalty(r, ids, estimator, w, pen), **TOL)


def test_gdpo_penalty_strength_follows_its_coefficient():
    """The old reward-column KL made coef 1e-3 and 1.0 nearly the same (GDPO
    normalized the column); now the change is proportional to coef."""
    r, ids, w, kl = _penalty_case()
    base_no_bn = np.asarray(adv_fn(r, ids, num_groups=G, estimator="gdpo_no_bn", weights=w))
    base = np.asarray(adv_fn(r, ids, num_groups=G, estimator="gdpo", weights=w))
    diffs, diffs_no_bn = {}, {}
    for coef in (1e-4, 1e-3, 1.0):
        pen = -coef * kl
        a = adv_fn(r, ids, num_groups=G, estimator="gdpo_no_bn", weights=w, penalty=pen)
        diffs_no_bn[coef] = np.asarray(a) - base_no_bn
        a = adv_fn(r, ids, num_groups=G, estimator="gdpo", weights=w, penalty=pen)
        diffs[coef] = np.asarray(a) - base
    # Without batch whitening the penalty is added as is: ratio exactly 1000.
    np.testing.assert_allclose(diffs_no_bn[1e-3], -1e-3 * kl, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(diffs_no_bn[1.0], 1000 * diffs_no_bn[1e-3], rtol=1e-3, atol=1e-5)
    # With whitening: linear while the penalty is small next to S (ratio 10 for 10x) ...
    small, big = np.abs(diffs[1e-4]).max(), np.abs(diffs[1e-3]).max()
    np.testing.assert_allclose(big / small, 10.0, rtol=0.02)
    # ... and a strong coefficient dominates instead of matching the weak one.
    assert np.abs(diffs[1.0]).max() > 50 * big
    # Old behaviour for reference: the penalty as a third reward column.
    col = lambda c: np.asarray(  # noqa: E731
        adv_fn(
            np.concatenate([r, -c * kl[:, None]], 1),
            ids,
            num_groups=G,
            estimator="gdpo",
            weights=np.append(w, 1.0),
        )
    )
    # 1000x the coefficient moved the advantages by < 0.1 (eps residue): an on/off switch.
    assert np.abs(col(1.0) - col(1e-3)).max() < 0.1 < np.abs(diffs[1.0]).max()


def test_grpo_penalty_equals_extra_weight_one_column():
    """GRPO keeps its behaviour: the penalty is summed into the reward before
    the group normalization, as an extra column of weight 1 was."""
    r, ids, w, kl = _penalty_case()
    pen = -0.1 * kl
    for est in ("grpo", "grpo_no_std"):
        got = adv_fn(r, ids, num_groups=G, estimator=est, weights=w, penalty=pen)
        col = adv_fn(
            np.concatenate([r, pen[:, None]], 1),
            ids,
            num_groups=G,
            estimator=est,
            weights=np.append(w, 1.0),
        )
        np.testing.assert_allclose(got, col, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_norm", ["sample", "token"])
@pytest.mark.parametrize("eps", [0.0, 1e-4])
def test_constant_nonzero_sums_whiten_to_exact_zero(eps, batch_norm):
    """GDPO's batch whitening of a batch whose every row sums to the same nonzero value
    (constant rewards, a KL-in-reward penalty alike on every row): exactly 0, as a
    constant group is. A plain sum(s)/N left a rounding residue that the division by
    its tiny std made O(1) at eps 0 (149 of 190 such batches)."""
    for n in (3, 6, 7, 10, 29):
        for c in (0.1, 0.3, 1 / 3, 0.7, 2.9):
            r = np.ones((n, 1), np.float32)
            ids = np.arange(n, dtype=np.int32) // 2
            adv = np.asarray(
                adv_fn(
                    r,
                    ids,
                    num_groups=n,
                    estimator="gdpo",
                    eps=eps,
                    batch_norm=batch_norm,
                    token_counts=np.full(n, 5, np.int32),
                    penalty=np.full(n, c, np.float32),
                )
            )
            np.testing.assert_array_equal(adv, np.zeros_like(adv), err_msg=f"n={n} c={c}")


def test_nan_rewards_zero_counts_an_unscorable_reward_as_0():
    """ "zero" (the official TRL patch's nan_to_num) on rewards with NaN / inf equals the
    default on the same rewards with those set to 0; by hand: a group [1, NaN] is
    [+-1/sqrt(2)] under "zero" and has < 2 scorable rows (0) under "omit"."""
    r = np.array([[1.0, 2.0], [np.nan, 1.0], [0.0, np.inf], [1.0, 3.0]], np.float32)
    ids = np.array([0, 0, 1, 1], np.int32)
    for est in ESTIMATORS:
        zero = np.asarray(adv_fn(r, ids, num_groups=2, estimator=est, nan_rewards="zero"))
        want = np.asarray(adv_fn(np.nan_to_num(r, posinf=0.0), ids, num_groups=2, estimator=est))
        np.testing.assert_allclose(zero, want, rtol=1e-6, atol=1e-7, err_msg=est)
    one = np.array([[1.0], [np.nan]], np.float32)
    gid = np.zeros(2, np.int32)
    a = np.asarray(adv_fn(one, gid, num_groups=1, estimator="gdpo_no_bn", nan_rewards="zero"))
    np.testing.assert_allclose(a, [0.5 / (math.sqrt(0.5) + 1e-4), -0.5 / (math.sqrt(0.5) + 1e-4)])
    np.testing.assert_array_equal(adv_fn(one, gid, num_groups=1, estimator="gdpo_no_bn"), [0, 0])
    with pytest.raises(ValueError, match="unknown nan_rewards 'nan'"):
        adv_fn(one, gid, num_groups=1, nan_rewards="nan")


def test_token_whitening_gives_rows_without_tokens_no_advantage():
    # Rows of 0 tokens are outside verl's token-weighted statistics but were whitened all
    # the same: with no spread among the rows that have tokens they came out near -1.4e4
    # (the step's adv/* metrics). Hand-worked: groups {0, 1}, {2, 3}, {4}; each pair is
    # (+-1/sqrt(2)) / (1/sqrt(2) + eps), and row 4 is alone (0).
    r = np.array([[1.0], [0.0], [1.0], [0.0], [1.0]], np.float32)
    ids = np.array([0, 0, 1, 1, 2], np.int32)
    a = 1 / math.sqrt(2) / (1 / math.sqrt(2) + 1e-6)
    for counts, s_rows in [([3, 0, 7, 0, 0], []), ([3, 0, 7, 2, 0], [0, 2, 3])]:
        got = np.asarray(
            compute_advantages(
                r, ids, num_groups=3, eps=1e-6, batch_norm="token", token_counts=np.array(counts)
            )
        )
        want = np.zeros(5)
        if s_rows:  # rows 0, 2 (S = a, 3 and 7 tokens) and 3 (S = -a, 2 tokens)
            s, w = np.array([a, a, -a]), np.array([3.0, 7.0, 2.0])
            mean = (w * s).sum() / w.sum()
            var = (w * (s - mean) ** 2).sum() / (w.sum() - 1)
            want[s_rows] = (s - mean) / math.sqrt(var + 1e-8)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            got,
            ref_advantages(r, ids, 3, "gdpo", eps=1e-6, batch_norm="token", token_counts=counts),
            rtol=1e-5,
            atol=1e-6,
        )


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_an_empty_batch_has_empty_advantages(estimator):
    # N = 0 raised "zero-size array to reduction operation max" in the batch whitening.
    for batch_norm in ("sample", "token"):
        got = compute_advantages(
            np.zeros((0, 2), np.float32),
            np.zeros((0,), np.int32),
            num_groups=1,
            estimator=estimator,
            batch_norm=batch_norm,
            token_counts=np.zeros((0,), np.int32),
        )
        assert got.shape == (0,)
