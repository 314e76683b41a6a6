r"""The two operand layouts that XLA:CPU's YNNPACK matmuls are sensitive to.

Each row times one jitted product in two layouts, at the shapes where the
project met it (best of `repeats` after a warm-up, same process):

* decode attention scores, `q @ k` for 64 rows x 2 kv heads x 2 query heads
  over 160 cache slots of head dim 64 (bench_sampler's last decode phase): keys
  stored `[S, Dh]` (a transposed right operand) vs `[Dh, S]` (the KV cache's
  layout, gdpo_jax/models/transformer.py KVCache);
* a weight gradient `dW = xᵀ @ dY` for 1168 rows (bench_rl's micro-batch of 16
  rows x 73 tokens), hidden 256 -> 640: autodiff's own lowering vs xᵀ
  materialized first (gdpo_jax/core/dense.py);
* for scale, the forward product of the same weight, `x @ W`.

    python -m benchmarks.profile_kernels [--out runs/bench/profile_kernels.json]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import common


def _best_ms(fn: Callable, *args: Any, repeats: int) -> float:
    import jax

    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def run(quick: bool = False) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    repeats = 30 if quick else 200
    rs = np.random.RandomState(0)

    def arr(*shape: int) -> jax.Array:
        return jnp.asarray(rs.randn(*shape), jnp.float32)

    B, K, G, S, D = 64, 2, 2, 160, 64
    q, k = arr(B, K, G, D), arr(B, K, S, D)
    kt = jnp.swapaxes(k, -1, -2)
    M, Din, F = 1168, 256, 640
    x, dy, w = arr(M, Din), arr(M, F), arr(Din, F)
    rows = [
        {
            "product": "decode scores q @ k (64 rows, 160 slots)",
            "reference": "k stored [S, Dh]",
            "reference_ms": _best_ms(
                lambda q, k: jnp.einsum("bkqd,bksd->bkqs", q, k), q, k, repeats=repeats
            ),
            "ours": "k stored [Dh, S]",
            "ours_ms": _best_ms(
                lambda q, k: jnp.einsum("bkqd,bkds->bkqs", q, k), q, kt, repeats=repeats
            ),
        },
        {
            "product": "weight gradient xᵀ @ dY (1168 rows, 256 -> 640)",
            "reference": "autodiff's lowering",
            "reference_ms": _best_ms(lambda x, g: x.T @ g, x, dy, repeats=repeats),
            "ours": "xᵀ materialized",
            "ours_ms": _best_ms(
                lambda x, g: jax.lax.optimization_barrier(x.T) @ g, x, dy, repeats=repeats
            ),
        },
    ]
    for r in rows:
        r["speedup"] = r["reference_ms"] / r["ours_ms"]
    forward_ms = _best_ms(lambda x, w: x @ w, x, w, repeats=repeats)
    return {
        "benchmark": "profile_kernels",
        "machine": common.machine_info(),
        "repeats": repeats,
        "rows": rows,
        "forward_same_weight_ms": forward_ms,
    }


def table_markdown(res: dict) -> str:
    """The markdown table of a run (docs/benchmarks.md shows the committed run's)."""
    rows = [
        {
            "product": r["product"],
            "layout before": r["reference"],
            "ms before": f"{r['reference_ms']:.3f}",
            "layout now": r["ours"],
            "ms now": f"{r['ours_ms']:.3f}",
            "speed-up": f"{r['speedup']:.2f}x",
        }
        for r in res["rows"]
    ]
    lines = [common.markdown_table(rows)]
    m = res.get("machine", {})
    lines.append(
        f"\n{m.get('cpu_model', '?')} ({m.get('cpu_isa', '')}), {m.get('cpu_usable', '?')} cores; "
        f"best of {res['repeats']}; the forward x @ W of the same weight: "
        f"{res['forward_same_weight_ms']:.3f} ms."
    )
    return "\n".join(lines)


def main() -> None:
    common.quick_out_main(__doc__, run, table_markdown, "runs/bench/profile_kernels.json")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
