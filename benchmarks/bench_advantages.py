"""Benchmark: jitted ``compute_advantages`` vs a plain vectorised NumPy version.

N = 65,536 rollouts in 4,096 groups of G = 16, K = 3 binary-ish rewards with a
few NaN, every estimator. The NumPy baseline (written here, ``np.bincount``
segment sums) is what a host-side trainer would do between rewards and the
gradient step; the JAX version runs on the accelerator inside the step.

  python -m benchmarks.bench_advantages [--quick] [--out runs/bench/advantages.json]
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import jax
import numpy as np

from benchmarks import common
from gdpo_jax.core.advantages import ESTIMATORS, compute_advantages

N, G, K = 65_536, 16, 3
DEFAULT_OUT = "runs/bench/advantages.json"


# --------------------------------------------------------------------------- #
# Vectorised NumPy reference implementation (same semantics, float64).
# --------------------------------------------------------------------------- #
def _np_group_norm(
    x: np.ndarray, m: np.ndarray, ids: np.ndarray, num_groups: int, eps: float, scale: bool
) -> np.ndarray:
    """x, m: [N, C]; per (group, column) (x - mean) / (std_ddof1 + eps) over m."""
    c = x.shape[1]
    flat = (ids[:, None] * c + np.arange(c)).ravel()
    size = num_groups * c
    xm = np.where(m, x, 0.0)
    cnt = np.bincount(flat, weights=m.ravel().astype(np.float64), minlength=size).reshape(-1, c)
    mean = np.bincount(flat, weights=xm.ravel(), minlength=size).reshape(-1, c) / np.maximum(cnt, 1)
    dev = np.where(m, x - mean[ids], 0.0)
    if scale:
        ss = np.bincount(flat, weights=(dev * dev).ravel(), minlength=size).reshape(-1, c)
        std = np.sqrt(ss / np.maximum(cnt - 1, 1))
        dev = dev / (std[ids] + eps)
    return np.where(m & (cnt >= 2)[ids], dev, 0.0)


def numpy_advantages(
    rewards: np.ndarray, group_ids: np.ndarray, num_groups: int, estimator: str, eps: float = 1e-4
) -> np.ndarray:
    """rewards f[N, K] (NaN = unscorable), group_ids i[N] -> f64[N]; all rows valid."""
    ids = group_ids.astype(np.int64)
    if estimator in ("grpo", "grpo_no_std"):
        s = np.nansum(rewards, axis=1, dtype=np.float64)[:, None]
        return _np_group_norm(s, np.ones_like(s, bool), ids, num_groups, eps, estimator == "grpo")[
            :, 0
        ]
    r = rewards.astype(np.float64)
    s = _np_group_norm(r, ~np.isnan(r), ids, num_groups, eps, True).sum(1)
    if estimator == "gdpo_no_bn":
        return s
    return (s - s.mean()) / (s.std(ddof=1) + eps)


# --------------------------------------------------------------------------- #
def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def make_inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 2, (N, K)).astype(np.float32)
    rewards[:, 1] *= rng.uniform(-3, 3, N).astype(np.float32)  # a continuous reward
    rewards[rng.random((N, K)) < 0.01] = np.nan
    # Rollout order as a sampler returns it: shuffled, groups not contiguous.
    group_ids = rng.permutation(np.repeat(np.arange(N // G, dtype=np.int32), G))
    return rewards, group_ids


def run(quick: bool = False) -> dict:
    """Times every estimator; returns a JSON-able dict (also used by benchmarks/run_all.py)."""
    repeats = 5 if quick else 30
    rewards, group_ids = make_inputs()
    num_groups = N // G
    r_dev, ids_dev = jax.device_put(rewards), jax.device_put(group_ids)
    rows = []
    for est in ESTIMATORS:
        f = jax.jit(partial(compute_advantages, num_groups=num_groups, estimator=est))
        t0 = time.perf_counter()
        got = np.asarray(f(r_dev, ids_dev).block_until_ready())
        compile_s = time.perf_counter() - t0
        want = numpy_advantages(rewards, group_ids, num_groups, est)
        # Loop variables bound as defaults: each closure times this iteration's f / est.
        jax_ms = _median_ms(lambda f=f: f(r_dev, ids_dev).block_until_ready(), repeats)
        np_ms = _median_ms(
            lambda est=est: numpy_advantages(rewards, group_ids, num_groups, est), repeats
        )
        rows.append(
            {
                "estimator": est,
                "jax_ms": round(jax_ms, 3),
                "numpy_ms": round(np_ms, 3),
                "speedup": round(np_ms / jax_ms, 2),
                "compile_s": round(compile_s, 3),
                "max_abs_diff": float(np.max(np.abs(got - want))),
            }
        )
    dev = jax.devices()[0]
    return {
        "benchmark": "advantages",
        "N": N,
        "G": G,
        "K": K,
        "num_groups": num_groups,
        "repeats": repeats,
        "backend": jax.default_backend(),
        "device": getattr(dev, "device_kind", str(dev)),
        "device_count": jax.device_count(),
        "results": rows,
    }


def format_table(result: dict) -> str:
    lines = [
        f"compute_advantages, N={result['N']} (G={result['G']}), K={result['K']}, "
        f"{result['backend']} ({result['device']}), median of {result['repeats']}",
        f"{'estimator':<12} {'jax ms':>9} {'numpy ms':>9} {'numpy/jax':>9} "
        f"{'compile s':>9} {'max|diff|':>9}",
    ]
    for r in result["results"]:
        lines.append(
            f"{r['estimator']:<12} {r['jax_ms']:>9.3f} {r['numpy_ms']:>9.3f} "
            f"{r['speedup']:>9.2f} {r['compile_s']:>9.3f} {r['max_abs_diff']:>9.1e}"
        )
    return "\n".join(lines)


def main() -> None:
    common.quick_out_main(__doc__, run, format_table, DEFAULT_OUT)


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
