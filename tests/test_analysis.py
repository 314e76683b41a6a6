"""Distinct-advantage-group counts (paper Fig. 2-3) vs hand enumeration and brute force."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from gdpo_jax.analysis import (
    count_distinct_advantage_groups,
    count_distinct_rows,
    distinct_advantage_counts,
    enumerate_reward_multisets,
    num_multisets,
)

S = 1 / math.sqrt(2)


def test_hand_enumerated_g2_k2():
    # Rollout reward vectors are in {00, 01, 10, 11}; sorted advantage vectors:
    # GRPO (sum, normalize): equal sums -> (0, 0); any difference -> (-1/sqrt2, 1/sqrt2).
    grpo = {(0, 0), (-S, S)}
    # GRPO w/o std: sum differences 0, 1, 2 -> (0,0), (-.5,.5), (-1,1).
    no_std = {(0, 0), (-0.5, 0.5), (-1, 1)}
    # GDPO: each differing reward adds +-1/sqrt2; {10, 01} cancels to (0, 0),
    # one differing reward gives +-1/sqrt2, two agreeing give +-sqrt2.
    gdpo = {(0, 0), (-S, S), (-2 * S, 2 * S)}
    counts = distinct_advantage_counts(2, 2)
    assert (
        counts
        == {
            "grpo": len(grpo),
            "grpo_no_std": len(no_std),
            "gdpo": len(gdpo),
            "gdpo_no_bn": len(gdpo),
        }
        == {"grpo": 2, "grpo_no_std": 3, "gdpo": 3, "gdpo_no_bn": 3}
    )
    assert count_distinct_advantage_groups(2, 2, "grpo") == 2
    assert count_distinct_advantage_groups(2, 2, "gdpo") == 3


def test_hand_enumerated_g3_k1():
    # Multisets {000, 001, 011, 111}: 000 and 111 both give (0,0,0); 001 and 011
    # give two different non-zero patterns -> 3 for every estimator (K = 1: no collapse).
    assert distinct_advantage_counts(3, 1) == dict.fromkeys(
        ("grpo", "grpo_no_std", "gdpo", "gdpo_no_bn"), 3
    )


def _brute_force(g: int, k: int) -> dict[str, int]:
    """Independent float64 count: per-multiset formulas, explicit loops."""
    seen = {"grpo": set(), "grpo_no_std": set(), "gdpo_no_bn": set()}
    for combo in itertools.combinations_with_replacement(
        list(itertools.product((0, 1), repeat=k)), g
    ):
        r = np.array(combo, np.float64)  # [G, K]
        s = r.sum(1)
        sd = s.std(ddof=1)
        seen["grpo"].add(tuple(np.round(sorted((s - s.mean()) / sd if sd > 0 else 0 * s), 9)))
        seen["grpo_no_std"].add(tuple(np.round(sorted(s - s.mean()), 9)))
        tot = np.zeros(g)
        for j in range(k):
            sdj = r[:, j].std(ddof=1)
            if sdj > 0:
                tot += (r[:, j] - r[:, j].mean()) / sdj
        seen["gdpo_no_bn"].add(tuple(np.round(sorted(tot), 9) + 0.0))
    out = {key: len(v) for key, v in seen.items()}
    out["gdpo"] = out["gdpo_no_bn"]  # batch whitening is one positive affine map
    return out


@pytest.mark.parametrize("g,k", [(3, 2), (4, 2), (2, 3)])
def test_matches_brute_force(g, k):
    assert distinct_advantage_counts(g, k) == _brute_force(g, k)


def test_enumeration_and_row_counting():
    rewards, ids, m = enumerate_reward_multisets(3, 2)
    assert m == num_multisets(3, 2) == math.comb(4 + 3 - 1, 3) == 20
    assert rewards.shape == (60, 2) and ids.shape == (60,)
    groups = {tuple(sorted(map(tuple, rewards[ids == i]))) for i in range(m)}
    assert len(groups) == m  # every multiset exactly once
    # float32 noise straddling a rounding boundary is still one value:
    adv = np.array([[0.1, 0.2], [0.2000001, 0.1], [0.1, 0.3]])
    assert count_distinct_rows(adv) == 2
    with pytest.raises(ValueError, match="smaller G or K"):
        enumerate_reward_multisets(16, 5)


def test_experiment_script_smoke(tmp_path):
    from experiments import advantage_groups

    result = advantage_groups.run(str(tmp_path), max_g=3, max_k=2, fixed_k=2, fixed_g=2)
    assert [r["G"] for r in result["by_g"]] == [2, 3]
    assert result["by_g"][0]["grpo"] == 2 and result["by_g"][0]["gdpo"] == 3
    saved = json.loads((tmp_path / "counts.json").read_text())
    assert saved["by_k"][1] == {**saved["by_k"][1], "G": 2, "K": 2, "grpo": 2, "gdpo": 3}
    assert (tmp_path / "advantage_groups.png").stat().st_size > 1000
