"""policy_loss / kl_penalty / aggregate: hand-worked cases, exact splits, gradients."""

from __future__ import annotations

import math
from functools import partial

import jax
import numpy as np
import pytest

from gdpo_jax.core import aggregate, kl_penalty, policy_loss, safe_div

# One token per row; each row exercises one branch of the clipped surrogate.
#            A     rho   expected per-token loss (clip 0.2/0.2, dual clip 3)  branch
CASES = [
    (+1.0, 0.5, -0.5, "unclipped, A>0"),
    (+1.0, 1.5, -1.2, "high clip: -A * 1.2"),
    (-1.0, 0.5, +0.8, "low clip: -A * 0.8"),
    (-1.0, 1.5, +1.5, "unclipped, A<0"),
    (-1.0, 4.0, +3.0, "dual clip: -A * 3"),
    (+2.0, 1.1, -2.2, "inside the trust region"),
]


def _case_arrays():
    adv = np.array([c[0] for c in CASES], np.float32)
    rho = np.array([c[1] for c in CASES], np.float32)
    old = np.full((len(CASES), 1), -1.0, np.float32)
    logp = old + np.log(rho)[:, None]
    return logp, old, adv, np.ones_like(old)


def test_each_clip_branch_hand_worked():
    logp, old, adv, mask = _case_arrays()
    want = np.array([c[2] for c in CASES])
    # "dr_grpo" with max_len=1 has sum = sum of per-token losses; probe one row at a time.
    for i, (_, _, expected, branch) in enumerate(CASES):
        m = np.zeros_like(mask)
        m[i] = 1.0
        s, d, _ = policy_loss(logp, old, adv, m, dual_clip=3.0, aggregation="dapo")
        assert float(s / d) == pytest.approx(expected, rel=1e-5), branch
    s, d, metrics = policy_loss(logp, old, adv, mask, dual_clip=3.0, aggregation="dapo")
    assert float(s) == pytest.approx(want.sum(), rel=1e-5) and float(d) == len(CASES)
    frac = {k: float(v[0] / v[1]) for k, v in metrics.items()}
    assert frac["clip_frac_high"] == pytest.approx(1 / 6)  # row 1
    assert frac["clip_frac_low"] == pytest.approx(1 / 6)  # row 2
    assert frac["clip_frac"] == pytest.approx(2 / 6)
    assert frac["clip_frac_dual"] == pytest.approx(1 / 6)  # row 4
    assert frac["ratio_max"] == pytest.approx(4.0, rel=1e-5)
    assert frac["ratio_min"] == pytest.approx(0.5, rel=1e-5)
    assert frac["ratio_mean"] == pytest.approx(np.mean([c[1] for c in CASES]), rel=1e-5)
    rho = np.array([c[1] for c in CASES])
    assert frac["approx_kl"] == pytest.approx(np.mean(rho - 1 - np.log(rho)), rel=1e-5)
    # Without dual clip the A<0, rho=4 row is unbounded: loss 4.
    s, _, metrics = policy_loss(logp[4:5], old[4:5], adv[4:5], mask[4:5], aggregation="dapo")
    assert float(s) == pytest.approx(4.0, rel=1e-5) and "clip_frac_dual" not in metrics


def test_gradient_is_zero_exactly_where_clipped():
    # d(per-token loss)/d logp = -A * rho where unclipped, 0 where a clip is active.
    logp, old, adv, mask = _case_arrays()
    grad = jax.grad(
        lambda lp: policy_loss(lp, old, adv, mask, dual_clip=3.0, aggregation="dr_grpo", max_len=1)[
            0
        ]
    )(logp)
    rho = np.array([c[1] for c in CASES])
    want = -adv * rho
    want[[1, 2, 4]] = 0.0
    np.testing.assert_allclose(grad[:, 0], want, rtol=1e-5, atol=1e-7)


def test_clip_higher():
    logp, old, adv, mask = (
        np.log([[1.25]]).astype(np.float32),
        np.zeros((1, 1), np.float32),
        np.ones(1, np.float32),
        np.ones((1, 1), np.float32),
    )
    s, _, m = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert float(s) == pytest.approx(-1.25, rel=1e-5) and float(m["clip_frac_high"][0]) == 0.0
    s, _, m = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert float(s) == pytest.approx(-1.2, rel=1e-5) and float(m["clip_frac_high"][0]) == 1.0


def test_kl_estimators_hand_worked():
    logp = np.log(np.array([[0.5]], np.float32))
    ref = np.log(np.array([[0.25]], np.float32))
    l2 = math.log(2.0)
    assert float(kl_penalty(logp, ref, "k1")[0, 0]) == pytest.approx(l2, rel=1e-5)
    # k3: r = p_ref / p = 0.5 -> r - log r - 1 = 0.5 + log 2 - 1
    assert float(kl_penalty(logp, ref, "k3")[0, 0]) == pytest.approx(0.5 + l2 - 1, rel=1e-5)
    assert float(kl_penalty(logp, ref, "low_var_kl")[0, 0]) == pytest.approx(0.5 + l2 - 1, rel=1e-5)
    assert float(kl_penalty(logp, ref, "mse")[0, 0]) == pytest.approx(0.5 * l2 * l2, rel=1e-5)
    # k3 is >= 0 and clamped at 10 (verl) for a wild token; k1 is not.
    wild = kl_penalty(np.array([[-30.0]]), np.array([[0.0]]), "k3")
    assert float(wild[0, 0]) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="unknown kl_estimator 'k2'.*k1"):
        kl_penalty(logp, ref, "k2")


def test_kl_and_entropy_terms_in_loss():
    logp = np.log(np.array([[0.5, 0.5]], np.float32))
    old = logp.copy()  # rho = 1
    ref = np.log(np.array([[0.25, 0.5]], np.float32))
    ent = np.array([[2.0, 1.0]], np.float32)
    mask = np.ones((1, 2), np.float32)
    adv = np.array([0.5], np.float32)
    k3 = 0.5 + math.log(2) - 1  # token 0; token 1 has KL 0
    s, d, m = policy_loss(
        logp,
        old,
        adv,
        mask,
        ref_logp=ref,
        beta=0.1,
        kl_estimator="k3",
        entropy=ent,
        entropy_coef=0.01,
        aggregation="dapo",
    )
    want = (-0.5 + 0.1 * k3 - 0.01 * 2.0) + (-0.5 - 0.01 * 1.0)
    assert float(s) == pytest.approx(want, rel=1e-5) and float(d) == 2
    assert float(m["kl"][0] / m["kl"][1]) == pytest.approx(k3 / 2, rel=1e-5)
    assert float(m["entropy"][0] / m["entropy"][1]) == pytest.approx(1.5)
    assert float(m["pg_loss"][0]) == pytest.approx(-1.0, rel=1e-5)


def test_aggregations_hand_worked():
    per_token = np.array([[1, 2, 3, 0], [4, 0, 0, 0], [5, 6, np.inf, np.nan]], np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    expect = {
        "grpo": (2 + 4, 2),  # row means 2 and 4; the empty row is not counted
        "bnpo": (10 / 4, 1),  # this micro-batch's token mean, one micro-batch
        "dapo": (10, 4),  # token sum, token count (summed over micro-batches)
        "dr_grpo": (10, 3 * 4),  # token sum, rows * max_len (T = 4)
    }
    for mode, (s_want, d_want) in expect.items():
        s, d = aggregate(per_token, mask, mode)
        assert (float(s), float(d)) == (s_want, d_want), mode
    assert float(aggregate(per_token, mask, "dr_grpo", max_len=8)[1]) == 24
    # Row 2 is batch padding: Dr. GRPO's denominator counts the 2 valid rows only.
    valid = np.array([True, True, False])
    s, d = aggregate(per_token, mask, "dr_grpo", row_valid=valid)
    assert (float(s), float(d)) == (10, 2 * 4)
    assert float(aggregate(per_token, mask, "dr_grpo", max_len=8, row_valid=valid)[1]) == 16
    # row_valid changes nothing for the modes that count tokens or rows with tokens.
    for mode in ("grpo", "bnpo", "dapo"):
        a = aggregate(per_token, mask, mode, row_valid=valid)
        assert tuple(map(float, a)) == tuple(map(float, aggregate(per_token, mask, mode)))
    # An empty micro-batch has zero loss and does not count as a bnpo micro-batch.
    s, d = aggregate(per_token, np.zeros_like(mask), "bnpo")
    assert (float(s), float(d)) == (0.0, 0.0)
    assert float(safe_div(*aggregate(per_token, np.zeros_like(mask), "dapo"))) == 0.0


def test_bnpo_is_per_micro_batch_dapo_is_global():
    """Two micro-batches, 3 and 1 tokens: bnpo averages their token means
    (TRL's bnpo under gradient accumulation), dapo divides by all 4 tokens."""
    x = np.array([[1, 2, 3], [8, 0, 0]], np.float32)
    m = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
    pairs = {
        mode: [aggregate(x[i : i + 1], m[i : i + 1], mode) for i in (0, 1)]
        for mode in ("bnpo", "dapo")
    }
    loss = {k: float(sum(p[0] for p in v) / sum(p[1] for p in v)) for k, v in pairs.items()}
    assert loss["bnpo"] == pytest.approx((6 / 3 + 8 / 1) / 2)  # 5.0
    assert loss["dapo"] == pytest.approx((6 + 8) / 4)  # 3.5
    # One micro-batch: both are the token mean.
    for mode in ("bnpo", "dapo"):
        assert float(safe_div(*aggregate(x, m, mode))) == pytest.approx(14 / 4)


@pytest.mark.parametrize("mode", ["grpo", "dapo", "dr_grpo"])  # bnpo: per micro-batch
def test_sum_denom_exact_over_micro_batches(mode):
    rng = np.random.default_rng(0)
    b, t = 8, 6
    logp = rng.normal(-1, 0.3, (b, t)).astype(np.float32)
    old = (logp + rng.normal(0, 0.3, (b, t))).astype(np.float32)
    adv = rng.normal(size=b).astype(np.float32)
    lens = rng.integers(0, t + 1, b)
    mask = (np.arange(t)[None] < lens[:, None]).astype(np.float32)
    f = jax.jit(partial(policy_loss, aggregation=mode, max_len=t))
    full = f(logp, old, adv, mask)
    parts = [f(logp[sl], old[sl], adv[sl], mask[sl]) for sl in (slice(0, 3), slice(3, 8))]
    np.testing.assert_allclose(sum(p[0] for p in parts), full[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sum(p[1] for p in parts), full[1], rtol=0, atol=0)
    for key in ("clip_frac", "approx_kl", "ratio_mean", "pg_loss"):
        np.testing.assert_allclose(
            sum(p[2][key][0] for p in parts), full[2][key][0], rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(sum(p[2][key][1] for p in parts), full[2][key][1])
    # Independent NumPy value of the full-batch loss.
    rho = np.exp(logp.astype(np.float64) - old)
    pg = np.maximum(-adv[:, None] * rho, -adv[:, None] * np.clip(rho, 0.8, 1.2))
    if mode == "grpo":
        rows = [pg[i, : lens[i]].mean() for i in range(b) if lens[i] > 0]
        want = (sum(rows), len(rows))
    else:
        want = (
            sum(pg[i, : lens[i]].sum() for i in range(b)),
            lens.sum() if mode != "dr_grpo" else b * t,
        )
    np.testing.assert_allclose((full[0], full[1]), want, rtol=1e-5)


def test_surrogate_gradient_vs_finite_differences():
    rng = np.random.default_rng(1)
    b, t = 4, 5
    old = rng.normal(-1.5, 0.3, (b, t)).astype(np.float32)
    # log-ratios in (-0.15, 0.1) or beyond 0.3: away from the clip kinks at log(0.8), log(1.2).
    lr = rng.choice([-0.1, 0.05, 0.4, -0.5], size=(b, t)) + rng.uniform(-0.03, 0.03, (b, t))
    logp0 = (old + lr).astype(np.float32)
    ref = (old + rng.normal(0, 0.2, (b, t))).astype(np.float32)
    adv = np.array([1.0, -0.7, 0.3, -1.2], np.float32)
    mask = np.ones((b, t), np.float32)
    mask[1, 3:] = 0

    def loss(lp, beta=0.05):
        s, d, _ = policy_loss(
            lp,
            old,
            adv,
            mask,
            ref_logp=ref,
            beta=beta,
            kl_estimator="k3",
            dual_clip=1.4,
            aggregation="grpo",
        )
        return s / d

    f = jax.jit(loss)
    grad = np.asarray(jax.jit(jax.grad(loss))(logp0))
    # The clipped tokens, from the ratios (NumPy): A > 0 above 1.2; A < 0 below 0.8
    # or above the dual clip 1.4. The check below covers both branches.
    r, a = np.exp(lr), adv[:, None]
    clipped = ((a > 0) & (r > 1.2)) | ((a < 0) & ((r < 0.8) | (r > 1.4)))
    valid = mask > 0
    assert 0 < (clipped & valid).sum() < valid.sum()
    h = 1e-3
    fd = np.zeros_like(grad)
    for i in range(b):
        for j in range(t):
            e = np.zeros_like(logp0)
            e[i, j] = h
            fd[i, j] = (float(f(logp0 + e)) - float(f(logp0 - e))) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=2e-2, atol=2e-4)
    assert np.all(grad[1, 3:] == 0)
    # Without the KL term the surrogate's gradient is 0 exactly on the clipped tokens
    # (and the masked ones); the KL term's keeps the clipped ones above nonzero.
    pg = np.asarray(jax.grad(lambda lp: loss(lp, beta=0.0))(logp0))
    np.testing.assert_array_equal(pg == 0, clipped | ~valid)


def test_errors():
    z = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="unknown aggregation 'mean'"):
        aggregate(z, z, "mean")
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(z, z, np.zeros(2), z, beta=0.1)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(z, z, np.zeros(2), z, entropy_coef=0.1)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(z, z, np.zeros(2), z, dual_clip=0.5)
    with pytest.raises(ValueError, match="advantages must be"):
        policy_loss(z, z, np.zeros(3), z)
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss(z, z, np.zeros(2), z, clip_low=1.0)


@pytest.mark.parametrize("axis_type", ["auto", "explicit"])
def test_sharded_loss_and_grad_equal_unsharded(axis_type):
    """Rows over ("data", "fsdp"), vocabulary over "tensor" (2 x 2 x 2 fake devices)."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from gdpo_jax.core import chunked_token_logprobs

    b, t, d, v = 8, 6, 4, 16
    rng = np.random.default_rng(0)
    h = rng.normal(size=(b, t, d)).astype(np.float32)
    u = rng.normal(size=(d, v)).astype(np.float32)
    tgt = rng.integers(0, v, (b, t)).astype(np.int32)
    old = rng.normal(-2.5, 0.3, (b, t)).astype(np.float32)
    adv = rng.normal(size=b).astype(np.float32)
    mask = (rng.random((b, t)) < 0.8).astype(np.float32)

    def step(h, u, tgt, old, adv, mask):
        def loss(h, u):
            lp, ent = chunked_token_logprobs(h, u, tgt, chunk_size=4)
            s, den, m = policy_loss(
                lp,
                old,
                adv,
                mask,
                ref_logp=old,
                beta=0.1,
                entropy=ent,
                entropy_coef=0.01,
                dual_clip=3.0,
            )
            return s / den, m

        return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(h, u)

    want = jax.jit(step)(h, u, tgt, old, adv, mask)
    at = AxisType.Auto if axis_type == "auto" else AxisType.Explicit
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(at,) * 3)
    with jax.set_mesh(mesh):
        rows = lambda x: jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"))))  # noqa: E731
        got = jax.jit(step)(
            rows(h),
            jax.device_put(u, NamedSharding(mesh, P(None, "tensor"))),
            rows(tgt),
            rows(old),
            rows(adv),
            rows(mask),
        )
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)


@pytest.mark.parametrize("kl_estimator", ["k1", "k3", "mse"])
@pytest.mark.parametrize("where, bad", [("old", np.nan), ("ref", np.nan), ("ref", -np.inf)])
def test_garbage_at_masked_positions_reaches_neither_loss_nor_gradient(kl_estimator, where, bad):
    # `aggregate` kept masked garbage out of the loss value only: a zero cotangent times a
    # NaN derivative made the gradient NaN at that position, and so on every parameter.
    logp = np.full((2, 3), -1.0, np.float32)
    old = np.full((2, 3), -1.1, np.float32)
    ref = np.full((2, 3), -0.9, np.float32)
    ent = np.full((2, 3), 0.5, np.float32)
    adv = np.array([1.0, -1.0], np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)

    def loss(lp, old, ref, ent):
        s, d, _ = policy_loss(
            lp,
            old,
            adv,
            mask,
            ref_logp=ref,
            beta=0.1,
            kl_estimator=kl_estimator,
            entropy=ent,
            entropy_coef=0.01,
            aggregation="dapo",
        )
        return safe_div(s, d)

    grad = jax.value_and_grad(loss, argnums=(0, 3))
    clean_v, (clean_g, clean_ge) = grad(logp, old, ref, ent)
    old_b, ref_b, ent_b = old.copy(), ref.copy(), ent.copy()
    {"old": old_b, "ref": ref_b}[where][0, 2] = bad
    ent_b[1, 2] = np.nan
    v, (g, ge) = grad(logp, old_b, ref_b, ent_b)
    assert float(v) == float(clean_v)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(clean_g))
    np.testing.assert_array_equal(np.asarray(ge), np.asarray(clean_ge))
    assert np.asarray(g)[0, 2] == 0.0 and np.asarray(g)[1, 1] == 0.0
