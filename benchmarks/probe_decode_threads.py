r"""Which of a decode step's weight products XLA:CPU spreads over the cores.

bench_sampler's decode multiplies 64 rows by each layer's weights: small products
(`[64, K] @ [K, N]`). This probe times each of them (bench_sampler's model's shapes,
`bench_sampler.HF_CONFIG`) in two fresh processes, one allowed every core of this
one and one pinned to a single core (`os.sched_setaffinity`, set before JAX starts),
so a product that runs no faster with the other cores is one XLA:CPU (YNNPACK) runs
on one thread. Each is timed as `CHAIN` products in one compiled loop (the rows
scaled between them, so none is hoisted out), best of `repeats` calls, per product.

Then, with every core, `INDEPENDENT` products of the o projection's shape that do not
depend on each other, in one program, against the same number chained (each
product's rows the previous one's result): whether XLA:CPU runs independent products
side by side, the way splitting a one-thread product by hand would need.

Each product is also checked against NumPy in f64 (`max_rel_diff`, relative to the
largest entry).

    python -m benchmarks.probe_decode_threads [--quick] [--out runs/bench/decode_threads.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import common

DEFAULT_OUT = "runs/bench/decode_threads.json"
MODULE = "benchmarks.probe_decode_threads"
ROWS = 64  # bench_sampler's rows: 8 prompts x G 8
CHAIN = 32  # products per timed call
INDEPENDENT = 8


def decode_products(hf_config: dict[str, Any], rows: int = ROWS) -> list[tuple[str, int, int, int]]:
    """(name, m, k, n) of each weight product of one decode step of the fused form
    (q/k/v and gate/up concatenated) for an HF-style Llama config."""
    c, dh = hf_config, hf_config["head_dim"]
    d, f = c["hidden_size"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * dh, c["num_key_value_heads"] * dh
    return [
        ("q/k/v (fused)", rows, d, q + 2 * kv),
        ("o projection", rows, q, d),
        ("gate/up (fused)", rows, d, 2 * f),
        ("down projection", rows, f, d),
        ("unembedding", rows, d, c["vocab_size"]),
    ]


def _best_ms(fn: Callable, args: tuple, repeats: int) -> float:
    """Best of `repeats` calls of `fn(*args)` after one (compiling) call, in ms."""
    import jax

    timed = common.time_fn(lambda: jax.block_until_ready(fn(*args)), repeats=repeats)
    return timed["best_s"] * 1e3


def _rel_diff(got: Any, want: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def _products(repeats: int) -> list[dict[str, Any]]:
    """Each decode product: ms per product over `CHAIN` in one loop, and its check."""
    import jax
    import jax.numpy as jnp

    from benchmarks.bench_sampler import HF_CONFIG

    rs = np.random.RandomState(0)
    out = []
    for name, m, k, n in decode_products(HF_CONFIG):
        x = rs.randn(m, k).astype(np.float32)
        w = (rs.randn(k, n) / np.sqrt(k)).astype(np.float32)

        @jax.jit
        def chain(x: jax.Array, w: jax.Array) -> jax.Array:
            """CHAIN products x_i @ w (x_i = x * 0.999^i: none is loop-invariant); f32[m, n]."""

            def body(_: int, carry: tuple) -> tuple:
                x, acc = carry
                return x * 0.999, acc + x @ w

            acc = jnp.zeros((x.shape[0], w.shape[1]), jnp.float32)
            return jax.lax.fori_loop(0, CHAIN, body, (x, acc))[1]

        ms = _best_ms(chain, (jnp.asarray(x), jnp.asarray(w)), repeats) / CHAIN
        scale = sum(0.999**i for i in range(CHAIN))
        want = x.astype(np.float64) @ w.astype(np.float64) * scale
        out.append(
            {
                "product": name,
                "m_k_n": [m, k, n],
                "ms": round(ms, 4),
                "gflops": round(2 * m * k * n / (ms * 1e-3) / 1e9, 1),
                "max_rel_diff": _rel_diff(chain(jnp.asarray(x), jnp.asarray(w)), want),
            }
        )
    return out


def _independent(repeats: int) -> dict[str, Any]:
    """`INDEPENDENT` o-projection products side by side vs chained, ms per product."""
    import jax
    import jax.numpy as jnp

    from benchmarks.bench_sampler import HF_CONFIG

    _, m, k, n = next(p for p in decode_products(HF_CONFIG) if p[0] == "o projection")
    rs = np.random.RandomState(1)
    x = rs.randn(m, k).astype(np.float32)
    ws = [(rs.randn(k, n) / np.sqrt(k)).astype(np.float32) for _ in range(INDEPENDENT)]

    @jax.jit
    def side_by_side(x: jax.Array, ws: list) -> tuple:
        return tuple(x @ w for w in ws)  # INDEPENDENT f32[m, n]

    @jax.jit
    def chained(x: jax.Array, ws: list) -> jax.Array:
        for w in ws:  # k == n: each product's rows are the last one's result
            x = x @ w
        return x

    args = (jnp.asarray(x), [jnp.asarray(w) for w in ws])
    got = side_by_side(*args)
    diff = max(_rel_diff(g, x.astype(np.float64) @ w.astype(np.float64)) for g, w in zip(got, ws))
    return {
        "product": "o projection",
        "m_k_n": [m, k, n],
        "count": INDEPENDENT,
        "side_by_side_ms": round(_best_ms(side_by_side, args, repeats) / INDEPENDENT, 4),
        "chained_ms": round(_best_ms(chained, args, repeats) / INDEPENDENT, 4),
        "max_rel_diff": diff,
    }


def _child(out: str, cores: int, repeats: int) -> None:
    """One measuring process: pinned to the first `cores` cores it may use."""
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, allowed[:cores])  # before JAX's pool starts
    res: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)), "products": _products(repeats)}
    if cores > 1:
        res["independent"] = _independent(repeats)
    with open(out, "w") as f:
        json.dump(res, f)


def run(quick: bool = False) -> dict[str, Any]:
    """Times the decode products on every core and on one, each in a fresh process."""
    repeats = 5 if quick else 50
    cores = len(os.sched_getaffinity(0))
    every = common.run_child(MODULE, [str(cores), str(repeats)])
    one = common.run_child(MODULE, ["1", str(repeats)])
    rows = []
    for a, b in zip(every["products"], one["products"]):
        rows.append(
            {
                **{k: a[k] for k in ("product", "m_k_n", "max_rel_diff")},
                "ms_all_cores": a["ms"],
                "ms_one_core": b["ms"],
                "gflops_all_cores": a["gflops"],
                "second_core_speedup": round(b["ms"] / a["ms"], 2),
            }
        )
    return {
        "benchmark": "decode_threads",
        "quick": quick,
        "repeats": repeats,
        "chain": CHAIN,
        "cores": every["cores"],
        "one_core_process_cores": one["cores"],  # the pinned process's cores: 1
        "rows": rows,
        "independent": every["independent"] if cores > 1 else None,
        "machine": common.machine_info(),
        "command": common.command_line(),
        "date": common.now_iso(),
    }


def table_markdown(res: dict[str, Any]) -> str:
    """The two tables of a run (docs/benchmarks.md shows the committed run's)."""
    rows = [
        {
            "product": r["product"],
            "m x k x n": " x ".join(map(str, r["m_k_n"])),
            f"ms, {res['cores']} cores": f"{r['ms_all_cores']:.4f}",
            "ms, 1 core": f"{r['ms_one_core']:.4f}",
            "GFLOP/s": f"{r['gflops_all_cores']:.0f}",
            "1 core s / all cores s": f"{r['second_core_speedup']:.2f}x",
        }
        for r in res["rows"]
    ]
    m = res["machine"]
    text = common.markdown_table(rows) + (
        f"\n\n{m.get('cpu_model', '?')} ({m.get('cpu_isa', '')}), {res['cores']} cores; "
        f"f32, ms per product over {res['chain']} in one compiled loop, best of "
        f"{res['repeats']} calls, each column in its own process."
    )
    ind = res.get("independent")
    if ind:
        side = {
            "products": f"{ind['count']} x {ind['product']} ({' x '.join(map(str, ind['m_k_n']))})",
            "independent, one program: ms each": f"{ind['side_by_side_ms']:.4f}",
            "chained: ms each": f"{ind['chained_ms']:.4f}",
            "chained s / independent s": f"{ind['chained_ms'] / ind['side_by_side_ms']:.2f}x",
        }
        text += "\n\n" + common.markdown_table([side])
    return text


def main() -> None:
    if sys.argv[1:2] == ["--_child"]:
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON output path.")
    parser.add_argument("--quick", action="store_true", help="Fewer repeats.")
    args = parser.parse_args()
    common.check_out(parser, args.out, "--out", is_dir=False)
    res = run(quick=args.quick)
    print(table_markdown(res))
    print(f"wrote {common.write_json(args.out, res)}")


if __name__ == "__main__":
    main()
