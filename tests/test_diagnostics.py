"""reward_shares (core/diagnostics.py): hand-worked cases and a NumPy reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdpo_jax.core import compute_advantages
from gdpo_jax.core.diagnostics import reward_shares


def np_shares(rewards, adv, gids, valid=None) -> np.ndarray:
    """Independent float64 reference: explicit loops over groups."""
    rewards = np.asarray(rewards, np.float64)
    adv = np.asarray(adv, np.float64)
    n, k = rewards.shape
    valid = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
    cov, scc, saa = np.zeros(k), np.zeros(k), 0.0
    for g in set(int(x) for x in gids):
        rows = [i for i in range(n) if gids[i] == g and valid[i]]
        arows = [i for i in rows if np.isfinite(adv[i])]
        amean = np.mean([adv[i] for i in arows]) if len(arows) >= 2 else None
        a = {i: (adv[i] - amean if amean is not None else 0.0) for i in arows}
        saa += sum(v * v for v in a.values())
        for kk in range(k):
            rr = [i for i in rows if np.isfinite(rewards[i, kk])]
            if len(rr) < 2:
                continue
            m = np.mean([rewards[i, kk] for i in rr])
            for i in rr:
                c = rewards[i, kk] - m
                cov[kk] += a.get(i, 0.0) * c
                scc[kk] += c * c
    out = np.zeros(k)
    for kk in range(k):
        if saa * scc[kk] > 0:
            out[kk] = cov[kk] ** 2 / (saa * scc[kk])
    return out


def _two_rewards(num_groups: int = 64, g: int = 8, seed: int = 0):
    """Correctness uniform in [-3, 3] and an independent {0, 1} format reward."""
    rng = np.random.default_rng(seed)
    n = num_groups * g
    corr = rng.uniform(-3, 3, n)
    fmt = (rng.random(n) < 0.3).astype(np.float64)
    gids = np.repeat(np.arange(num_groups), g).astype(np.int32)
    return np.stack([fmt, corr], 1).astype(np.float32), gids


def test_constant_reward_has_share_zero_and_the_other_takes_all():
    # Hand-worked: reward 0 constant in every group; A is reward 1 centred.
    r = np.array([[5.0, 0.0], [5.0, 1.0], [2.0, 1.0], [2.0, 0.0]], np.float32)
    gids = np.array([0, 0, 1, 1], np.int32)
    adv = np.array([-0.5, 0.5, 0.5, -0.5], np.float32)
    got = np.asarray(reward_shares(r, adv, gids, num_groups=2))
    np.testing.assert_allclose(got, [0.0, 1.0], atol=1e-6)


def test_hand_worked_two_rewards_equal_footing():
    # One group of 4: r1 = (1,1,0,0), r2 = (1,0,1,0); A = z1 + z2 (both std 1 up to
    # a common factor) = (2,0,0,-2) * s -> cov with c1 = (.5,.5,-.5,-.5) is 2s,
    # |a|^2 = 8 s^2, |c1|^2 = 1 -> share = 4 / 8 = 0.5 each.
    r = np.array([[1, 1], [1, 0], [0, 1], [0, 0]], np.float32)
    adv = np.array([2.0, 0.0, 0.0, -2.0], np.float32)
    got = np.asarray(reward_shares(r, adv, np.zeros(4, np.int32), num_groups=1))
    np.testing.assert_allclose(got, [0.5, 0.5], atol=1e-6)


def test_gdpo_shares_add_to_one_only_with_the_same_spreads_in_every_group():
    # Two groups of 4, rewards uncorrelated within each. r2 = (0,0,1,1) in both; r1 =
    # (0,1,0,1) in group 0 and (0,s,0,s) in group 1. GDPO divides each reward by its
    # own group std, so its advantage has the same pattern p in both groups while
    # r1's centred values are s times larger in group 1. With u, v the centred
    # r1 / r2 patterns (|u|^2 = |v|^2 = 1, std 1/sqrt(3)): p = sqrt(3) (u + v),
    # |a|^2 = 2 * 6 = 12; share1 = (sqrt(3) (1 + s))^2 / (12 (1 + s^2)),
    # share2 = (2 sqrt(3))^2 / (12 * 2) = 0.5. s = 1: 0.5 + 0.5; s = 3: 0.4 + 0.5.
    gids = np.repeat(np.arange(2, dtype=np.int32), 4)
    for s, want in ((1.0, [0.5, 0.5]), (3.0, [0.4, 0.5])):
        r1 = np.array([0, 1, 0, 1, 0, s, 0, s], np.float32)
        r2 = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.float32)
        r = np.stack([r1, r2], axis=1)
        adv = compute_advantages(  # eps 0: the stds exactly, as the hand count
            jnp.asarray(r), jnp.asarray(gids), num_groups=2, estimator="gdpo", eps=0.0
        )
        got = np.asarray(reward_shares(r, adv, gids, num_groups=2))
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_grpo_lets_the_large_scale_reward_dominate_and_gdpo_does_not():
    r, gids = _two_rewards()
    ng = int(gids.max()) + 1
    shares = {}
    for est in ("grpo", "grpo_no_std", "gdpo"):
        adv = compute_advantages(jnp.asarray(r), jnp.asarray(gids), num_groups=ng, estimator=est)
        shares[est] = np.asarray(reward_shares(r, adv, gids, num_groups=ng))
        np.testing.assert_allclose(shares[est], np_shares(r, adv, gids), atol=1e-5)
    # Format var 0.21 vs correctness var 3: GRPO's advantage is ~93 % correctness.
    assert shares["grpo"][1] > 0.85 and shares["grpo"][0] < 0.15
    assert shares["grpo_no_std"][0] < 0.15
    # GDPO: both rewards on equal footing (independent -> ~0.5 each, summing to ~1).
    assert abs(shares["gdpo"][0] - shares["gdpo"][1]) < 0.15
    assert 0.9 < shares["gdpo"].sum() < 1.1
    # Invariant to the scale/offset of the advantage (GDPO's batch whitening).
    adv = compute_advantages(jnp.asarray(r), jnp.asarray(gids), num_groups=ng, estimator="gdpo")
    scaled = np.asarray(reward_shares(r, 3.0 * adv + 1.0, gids, num_groups=ng))
    np.testing.assert_allclose(scaled, shares["gdpo"], atol=1e-5)


def test_nan_rewards_invalid_rows_and_out_of_range_ids_are_left_out():
    rng = np.random.default_rng(1)
    r, gids = _two_rewards(num_groups=6, g=4, seed=2)
    adv = rng.normal(size=r.shape[0]).astype(np.float32)
    r[3, 0] = np.nan
    r[7, 1] = np.inf
    valid = np.ones(r.shape[0], bool)
    valid[5] = False
    gids = gids.copy()
    gids[10] = -1  # padding row
    got = np.asarray(reward_shares(r, adv, gids, num_groups=6, valid=valid))
    ok = valid & (gids >= 0)
    np.testing.assert_allclose(got, np_shares(r, adv, gids, ok), atol=1e-5)
    assert np.all(np.isfinite(got))
    # Values on excluded rows do not matter.
    r2, adv2 = r.copy(), adv.copy()
    r2[5] = 1e6
    adv2[10] = -1e6
    np.testing.assert_allclose(
        np.asarray(reward_shares(r2, adv2, gids, num_groups=6, valid=valid)), got, atol=1e-6
    )


def test_zero_advantage_and_groups_of_one_give_zero_not_nan():
    r = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32)
    got = np.asarray(reward_shares(r, np.zeros(3, np.float32), np.array([0, 0, 1]), num_groups=2))
    np.testing.assert_array_equal(got, [0.0, 0.0])
    got = np.asarray(reward_shares(r, np.ones(3, np.float32), np.array([0, 1, 2]), num_groups=3))
    np.testing.assert_array_equal(got, [0.0, 0.0])


def test_bad_shapes_are_one_line_errors():
    with pytest.raises(ValueError, match="adv must have shape"):
        reward_shares(np.zeros((4, 2)), np.zeros(3), np.zeros(4, np.int32), num_groups=1)
    with pytest.raises(ValueError, match="rewards must be rank 2"):
        reward_shares(np.zeros(4), np.zeros(4), np.zeros(4, np.int32), num_groups=1)


def test_sharded_rows_equal_unsharded():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n_dev = len(jax.devices())
    r, gids = _two_rewards(num_groups=8, g=4 * max(1, n_dev // 2), seed=3)
    adv = compute_advantages(jnp.asarray(r), jnp.asarray(gids), num_groups=8, estimator="grpo")
    want = np.asarray(reward_shares(r, adv, gids, num_groups=8))
    mesh = jax.make_mesh((n_dev,), ("data",))
    rows = NamedSharding(mesh, P("data"))
    fn = jax.jit(lambda a, b, c: reward_shares(a, b, c, num_groups=8))
    got = fn(
        jax.device_put(jnp.asarray(r), NamedSharding(mesh, P("data", None))),
        jax.device_put(adv, rows),
        jax.device_put(jnp.asarray(gids), rows),
    )
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


@pytest.mark.parametrize(
    "estimator, nan_rewards", [("grpo", "omit"), ("grpo_no_std", "omit"), ("gdpo", "zero"),
                               ("gdpo", "omit"), ("gdpo_no_bn", "omit")]
)  # fmt: skip
def test_one_rewards_share_is_one_with_a_nan_read_as_the_estimator_reads_it(estimator, nan_rewards):
    """One group [1, NaN, 0, 0], one reward: the advantage is wholly that reward, so its
    share is 1 when the share reads the NaN as the estimator did (GRPO's sum and
    nan_rewards="zero": a 0; GDPO's "omit": left out). Read raw, GRPO's was 0.889."""
    from gdpo_jax.core.advantages import rewards_as_read

    r = np.array([[1.0], [np.nan], [0.0], [0.0]], np.float32)
    gids = np.zeros(4, np.int32)
    adv = compute_advantages(r, gids, num_groups=1, estimator=estimator, nan_rewards=nan_rewards)
    read = rewards_as_read(r, estimator=estimator, nan_rewards=nan_rewards)
    np.testing.assert_array_equal(np.isnan(np.asarray(read))[:, 0], [
        False, estimator.startswith("gdpo") and nan_rewards == "omit", False, False
    ])  # fmt: skip
    got = float(reward_shares(read, adv, gids, num_groups=1)[0])
    np.testing.assert_allclose(got, 1.0, atol=1e-6)
    # The NumPy reference agrees on the rewards as read.
    np.testing.assert_allclose(np_shares(np.asarray(read), np.asarray(adv), gids)[0], 1.0)


@pytest.mark.parametrize("scale", [1.0, 1e-3, 5e-4, 1e-6])
def test_the_share_does_not_depend_on_the_rewards_or_advantages_scale(scale):
    """The share is scale-invariant (module docstring); an absolute floor made a reward
    and advantage on a scale of 5e-4 share 0 (1 at 1e-3)."""
    r = np.array([[5.0, 0.0], [5.0, 1.0], [2.0, 1.0], [2.0, 0.0]], np.float32)
    gids = np.array([0, 0, 1, 1], np.int32)
    adv = np.array([-0.5, 0.5, 0.5, -0.5], np.float32)
    for ra, aa in ((scale, scale), (scale, 1.0), (1.0, scale)):
        got = np.asarray(reward_shares(r * ra, adv * aa, gids, num_groups=2))
        np.testing.assert_allclose(got, [0.0, 1.0], atol=1e-5, err_msg=f"{ra} {aa}")
