r"""The two operand layouts that XLA:CPU's YNNPACK matmuls are sensitive to.

Each row times one jitted product in two layouts, at the shapes where the
project met it (best of `repeats` after a warm-up, same process):

* decode attention scores, `q @ k` for 64 rows x 2 kv heads x 2 query heads
  over 160 cache slots of head dim 64 (bench_sampler's last decode phase): keys
  stored `[S, Dh]` (a transposed right operand) vs `[Dh, S]` (the KV cache's
  layout, gdpo_jax/models/kvcache.py KVCache);
* a weight gradient `dW = xᵀ @ dY` for 1168 rows (bench_rl's micro-batch of 16
  rows x 73 tokens in the per-row layout, before prompt sharing), hidden
  256 -> 640: autodiff's own lowering vs xᵀ materialized first
  (gdpo_jax/core/dense.py);
* for scale, the forward product of the same weight, `x @ W`.

Those rows reread one operand that stays in cache. A decode step streams its
layers' caches from memory (with the weights they exceed the last-level
cache), so a second table times the score dot out of cache: one jitted call
over enough layers' keys (`STREAM_MB` in all) that each is read from memory,
at 64, 128 and 256 slots, in the cache's `[Dh, S]` layout and with the slots in
blocks of 64 (`[S/64, Dh, 64]`, one batch of blocks), beside `p @ v` over the
same bytes (`[S, Dh]`, the values' layout) for the bandwidth a streaming dot
reaches. Scores are checked equal (each is one dot over Dh either way).

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


STREAM_MB = 96  # the out-of-cache working set, past the last-level cache of the kinds seen
BLOCK = 64  # slots per block of the blocked key layout


def _streamed_scores(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """The decode score dot over `STREAM_MB` of keys (out of cache), per slot count."""
    import jax
    import jax.numpy as jnp

    B, K, G, D = 64, 2, 2, 64
    rs = np.random.RandomState(1)
    out = []
    for S in (64, 128) if quick else (64, 128, 256):
        mb = B * K * D * S * 4 / 1e6
        layers = -int(-STREAM_MB // mb)
        J = S // BLOCK
        q = jnp.asarray(rs.randn(B, K, G, D), jnp.float32)
        p = jax.nn.softmax(jnp.asarray(rs.randn(B, K, G, S), jnp.float32), axis=-1)
        kts = [jnp.asarray(rs.randn(B, K, D, S), jnp.float32) for _ in range(layers)]
        blocks = [x.reshape(B, K, D, J, BLOCK).transpose(0, 1, 3, 2, 4) for x in kts]
        blocks = [jnp.asarray(np.ascontiguousarray(x)).reshape(B * K * J, D, BLOCK) for x in blocks]
        vs = [jnp.asarray(np.ascontiguousarray(np.swapaxes(x, -1, -2))) for x in kts]

        def flat(q: jax.Array, kts: list) -> list:
            return [jnp.einsum("bkqd,bkds->bkqs", q, x) for x in kts]

        def blocked(q: jax.Array, bs: list) -> list:
            j = bs[0].shape[0] // (B * K)  # blocks per (row, kv head)
            qb = jnp.broadcast_to(q[:, :, None], (B, K, j, G, D)).reshape(B * K * j, G, D)
            return [
                jnp.einsum("nqd,nds->nqs", qb, x)
                .reshape(B, K, j, G, BLOCK)
                .transpose(0, 1, 3, 2, 4)
                .reshape(B, K, G, j * BLOCK)
                for x in bs
            ]

        def pv(p: jax.Array, vs: list) -> list:
            return [jnp.einsum("bkqs,bksd->bkqd", p, x) for x in vs]

        same = all(
            bool(jnp.array_equal(a, b))
            for a, b in zip(jax.jit(flat)(q, kts), jax.jit(blocked)(q, blocks), strict=True)
        )
        ms = {
            name: _best_ms(fn, a, xs, repeats=repeats) / layers
            for name, fn, a, xs in (
                ("flat", flat, q, kts),
                ("blocked", blocked, q, blocks),
                ("pv", pv, p, vs),
            )
        }
        out.append(
            {
                "slots": S,
                "layers": layers,
                "mb_per_layer": round(mb, 2),
                "kt_ms": ms["flat"],
                "blocked_ms": ms["blocked"],
                "pv_ms": ms["pv"],
                "same_scores": same,
            }
        )
    return out


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
        "streamed_scores": _streamed_scores(5 if quick else 20, quick),
        "streamed_repeats": 5 if quick else 20,
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
        f"\n{common.cpu_label(m)}; "
        f"best of {res['repeats']}; the forward x @ W of the same weight: "
        f"{res['forward_same_weight_ms']:.3f} ms."
    )
    if res.get("streamed_scores"):
        lines.append("\n" + streamed_table(res))
    return "\n".join(lines)


def streamed_table(res: dict) -> str:
    """The out-of-cache score dot's table: ms per layer and the GB/s its keys stream at."""
    rows = []
    for r in res["streamed_scores"]:
        gb = r["mb_per_layer"] / 1e3
        rows.append(
            {
                "slots": r["slots"],
                "layers (MB each)": f"{r['layers']} ({r['mb_per_layer']:.1f})",
                "q @ k, keys [Dh, S]: ms": f"{r['kt_ms']:.3f}",
                "GB/s, [Dh, S]": f"{gb / r['kt_ms'] * 1e3:.0f}",
                "q @ k, keys in 64-slot blocks: ms": f"{r['blocked_ms']:.3f}",
                "GB/s, blocks": f"{gb / r['blocked_ms'] * 1e3:.0f}",
                "p @ v, values [S, Dh]: ms": f"{r['pv_ms']:.3f}",
                "GB/s, p @ v": f"{gb / r['pv_ms'] * 1e3:.0f}",
                "same scores": "yes" if r["same_scores"] else "no",
            }
        )
    return (
        common.markdown_table(rows)
        + f"\n\nOut of cache: one call over {STREAM_MB} MB of keys (or values), ms per layer,"
        f" best of {res['streamed_repeats']}."
    )


def main() -> None:
    common.quick_out_main(__doc__, run, table_markdown, "runs/bench/profile_kernels.json")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
