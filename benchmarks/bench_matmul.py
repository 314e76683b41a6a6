r"""Benchmark: XLA's f32 matmuls against PyTorch's, at the shapes the CPU benchmarks run.

bench_rl's step and bench_sampler's decode are mostly matrix products (four
fifths of the traced step, docs/benchmarks.md), so how fast each framework's
matmul library runs *those* products on a given CPU bounds the ratios
run_all publishes for it. This times each product alone, jitted `a @ b` (XLA:CPU,
YNNPACK) and `torch.matmul` (PyTorch's CPU BLAS, its default thread count),
in blocks of calls taken in turn (`_blocks`), so both see the same machine load:

* "step": bench_rl's step, one micro-batch of its rows' tokens
  (`OURS_MICROBATCHES`; prompt sharing runs the rows' completion tokens through
  the layers) against each weight of its model: the forward `x @ W` per
  projection and the unembedding, the input gradient `dY @ Wᵀ` and the weight
  gradient `xᵀ @ dY` (xᵀ materialized first, as gdpo_jax/core/dense.py does) of
  the MLP's up projection;
* "decode": bench_sampler's decode step, its 64 rows against each weight of its
  model in the fused form (q/k/v and gate/up concatenated, sampling/decode.py);
* "peak": one 2048-cube product (run_all's matmul peak).

The ratio is PyTorch's seconds over XLA's: above 1, XLA's kernel is faster. A
family's ratio is the sum of PyTorch's best times over the sum of XLA's (each
product once), the figure run_all's summary shows per machine kind.

  python -m benchmarks.bench_matmul [--quick] [--out runs/bench/matmul.json]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import common

DEFAULT_OUT = "runs/bench/matmul.json"
ROUNDS = 4  # blocks of calls per framework, in turn (_blocks)
FAMILIES = ("step", "decode", "peak")


def products() -> list[dict[str, Any]]:
    """[{family, product, m, k, n, rhs_t}]: `[m, k] @ [k, n]`, or `[m, k] @ [n, k]ᵀ`
    where rhs_t (the right operand stored transposed, as an input gradient reads
    its weight). Shapes come from bench_rl's and bench_sampler's configs."""
    from benchmarks import bench_rl, bench_sampler

    s = bench_rl.SHAPES["tiny"]
    dh = s.hidden // s.heads
    m = s.prompts * s.generations * s.new_tokens // s.microbatches
    h, f, q, kv = s.hidden, s.inter, s.heads * dh, s.kv_heads * dh
    out = [
        ("q projection", m, h, q, False),
        ("k or v projection", m, h, kv, False),
        ("o projection", m, q, h, False),
        ("gate or up projection", m, h, f, False),
        ("down projection", m, f, h, False),
        ("unembedding", m, h, s.vocab, False),
        ("input gradient dY @ Wᵀ (up)", m, f, h, True),
        ("weight gradient xᵀ @ dY (up)", h, m, f, False),
    ]
    rows = [dict(family="step", product=p, m=a, k=b, n=c, rhs_t=t) for p, a, b, c, t in out]
    c = bench_sampler.HF_CONFIG
    b = bench_sampler.MODELS["tiny"][1] * bench_sampler.MODELS["tiny"][2]
    d, dh = c["hidden_size"], c["head_dim"]
    qkv = (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * dh
    dec = [
        ("q/k/v fused", b, d, qkv),
        ("o projection", b, c["num_attention_heads"] * dh, d),
        ("gate/up fused", b, d, 2 * c["intermediate_size"]),
        ("down projection", b, c["intermediate_size"], d),
        ("unembedding", b, d, c["vocab_size"]),
    ]
    rows += [dict(family="decode", product=p, m=a, k=k, n=n, rhs_t=False) for p, a, k, n in dec]
    rows.append(dict(family="peak", product="2048 cube", m=2048, k=2048, n=2048, rhs_t=False))
    return rows


def _blocks(fns: list[Callable[[], Any]], calls: int, rounds: int) -> list[float]:
    """Best seconds of each function over `rounds` blocks of `calls` back-to-back calls
    (`common.time_fn`, one untimed call first), the functions' blocks in turn. Blocks,
    not single calls in turn: after a call, each framework's idle worker threads
    spin-wait (PyTorch's OpenMP, XLA's pool) and slow the other framework's next call
    (interleaving single calls made XLA's step-shape products up to 2x slower on the
    Intel Xeon kind); the untimed call lets them settle."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], common.time_fn(fn, repeats=calls, warmup=1)["best_s"])
    return best


def _time_product(p: dict[str, Any], a: np.ndarray, b: np.ndarray, reps: int) -> dict[str, Any]:
    """One product on both sides, in blocks of calls taken in turn: best ms, GFLOP/s,
    their ratio and the largest difference of the results (relative to the largest
    entry)."""
    import jax
    import jax.numpy as jnp
    import torch

    ja, jb, ta, tb = jnp.asarray(a), jnp.asarray(b), torch.from_numpy(a), torch.from_numpy(b)
    xla = jax.jit(lambda x, y: x @ (y.T if p["rhs_t"] else y))

    def ours() -> jax.Array:
        return jax.block_until_ready(xla(ja, jb))

    def theirs() -> torch.Tensor:
        return ta @ (tb.t() if p["rhs_t"] else tb)

    t_xla, t_torch = _blocks([ours, theirs], calls=reps, rounds=ROUNDS)
    # The same product on both sides: their results agree to f32 rounding.
    want = theirs().numpy()
    diff = float(np.abs(np.asarray(ours()) - want).max() / np.abs(want).max())
    flops = 2.0 * p["m"] * p["k"] * p["n"]
    return {
        "xla_ms": t_xla * 1e3,
        "torch_ms": t_torch * 1e3,
        "xla_gflops": round(flops / t_xla / 1e9, 1),
        "torch_gflops": round(flops / t_torch / 1e9, 1),
        "ratio": round(t_torch / t_xla, 3),
        "max_rel_diff": diff,
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Returns a JSON-able dict (used by benchmarks/run_all.py); on an accelerator
    backend, a skip (the question is the CPU libraries': there PyTorch would run on
    another device, or at another default f32 precision)."""
    import jax
    import torch

    if jax.default_backend() != "cpu":
        return {"benchmark": "matmul", "skipped": f"CPU only ({jax.default_backend()})"}
    rs = np.random.RandomState(0)
    results = []
    for p in products():
        a = rs.randn(p["m"], p["k"]).astype(np.float32)
        b = rs.randn(*((p["n"], p["k"]) if p["rhs_t"] else (p["k"], p["n"]))).astype(np.float32)
        big = p["m"] * p["k"] * p["n"] > 2**30
        reps = (1 if quick else 3) if big else (10 if quick else 40)
        results.append(p | _time_product(p, a, b, reps))
    return {
        "benchmark": "matmul",
        "quick": quick,
        "torch_threads": torch.get_num_threads(),
        "results": results,
        "families": family_ratios(results),
    }


def family_ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    """{family: PyTorch's summed best ms / XLA's} over the family's products."""
    out = {}
    for fam in FAMILIES:
        rows = [r for r in results if r["family"] == fam]
        if rows:
            out[fam] = round(sum(r["torch_ms"] for r in rows) / sum(r["xla_ms"] for r in rows), 3)
    return out


def format_table(res: dict[str, Any]) -> str:
    """The markdown table of a run (docs/benchmarks.md shows committed runs')."""
    if "skipped" in res:
        return f"bench_matmul skipped: {res['skipped']}."
    rows = [
        {
            "shapes of": r["family"],
            "product": r["product"],
            "m x k x n": f"{r['m']} x {r['k']} x {r['n']}",
            "XLA ms": f"{r['xla_ms']:.3f}",
            "PyTorch ms": f"{r['torch_ms']:.3f}",
            "XLA GFLOP/s": f"{r['xla_gflops']:.0f}",
            "PyTorch GFLOP/s": f"{r['torch_gflops']:.0f}",
            "PyTorch s / XLA s": f"{r['ratio']:.2f}x",
        }
        for r in res["results"]
    ]
    m = res.get("machine", {})
    fams = ", ".join(f"{k} {v:.2f}x" for k, v in res["families"].items())
    return (
        common.markdown_table(rows)
        + f"\n\n{m.get('cpu_model', '?')} ({m.get('cpu_isa', '')}), {m.get('cpu_usable', '?')}"
        f" cores; PyTorch {res['torch_threads']} threads; f32, best of {ROUNDS} blocks of"
        f" calls each, in turn; summed per family: {fams}."
    )


def main() -> None:
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers, as run_all's children

    def run_with_machine(quick: bool = False) -> dict[str, Any]:
        return run(quick) | {"machine": common.machine_info()}

    common.quick_out_main(__doc__, run_with_machine, format_table, DEFAULT_OUT)


if __name__ == "__main__":
    main()
