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
* "peak": one 2048-cube product (run_all's matmul peak);
* "decode chain": every product of one decode step in order (each layer's own
  weights, then the unembedding), `CHAIN_STEPS` steps: XLA in one compiled loop,
  as the sampler runs them, PyTorch eagerly, as `generate()` does. Alone, each
  product above reads one weight that stays in cache and pays a call of its own;
  in the chain the weights come from memory one after another. "decode chain,
  with glue" adds what runs between the products (RMS norms, the MLP's gating,
  residual adds): XLA fuses it, PyTorch runs it op by op.

The ratio is PyTorch's seconds over XLA's: above 1, XLA's kernel is faster. A
family's ratio is the sum of PyTorch's best times over the sum of XLA's (each
product once), the figure run_all's summary shows per machine kind. Each row's
"max_rel_diff" checks that both sides computed the same thing; for the chains it
is taken over a separate call of their first `CHECK_STEPS` steps ("check_steps").

  python -m benchmarks.bench_matmul [--quick] [--out runs/bench/matmul.json]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import common

DEFAULT_OUT = "runs/bench/matmul.json"
ROUNDS = 4  # blocks of calls per framework, in turn (_blocks)
FAMILIES = ("step", "decode", "peak", "decode chain", "decode chain, with glue")
CHAIN_STEPS = 64  # decode steps per timed call of the chain (--quick: 8)
# Steps of the chain whose results the two sides must agree on. The glued chain
# (renormalised residual adds) amplifies f32 rounding from step to step: after 64
# steps two correct implementations disagree completely (the committed runs of
# 2026-12-03/04 recorded max_rel_diff 1.25-1.44 there), so a wrong chain could not
# be told from a right one; over the first 8 steps rounding alone stays far below
# tests/test_bench_matmul.py's 1e-3.
CHECK_STEPS = 8


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


def chain_weights(rs: np.random.RandomState) -> dict[str, Any]:
    """bench_sampler's model in the decode's fused form: per layer q/k/v f32[D, Q + 2 K],
    o f32[Q, D], gate/up f32[D, 2 F], down f32[F, D] (lists of L), unembedding f32[D, V];
    entries scaled by 1/sqrt(fan-in): the glued chain's values stay O(1), the bare
    chain's drift (about 1e4x in 64 steps), far inside f32's range."""
    from benchmarks import bench_sampler

    c = bench_sampler.HF_CONFIG
    d, dh, f = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * dh, c["num_key_value_heads"] * dh

    def w(k: int, n: int) -> np.ndarray:
        return (rs.randn(k, n) / np.sqrt(k)).astype(np.float32)

    layers = range(c["num_hidden_layers"])
    return {
        "qkv": [w(d, q + 2 * kv) for _ in layers],
        "o": [w(q, d) for _ in layers],
        "gate_up": [w(d, 2 * f) for _ in layers],
        "down": [w(f, d) for _ in layers],
        "unembed": w(d, c["vocab_size"]),
    }


def chain_step(x: Any, w: dict[str, Any], xp: Any, glue: bool = True) -> Any:
    """One decode step's products in order, on x [B, D] (NumPy-like module xp: jax.numpy
    or torch). With glue, the model's kinds of elementwise work between them (its
    RMS norms without their scales, its gating without the SiLU): per layer
    x += (norm(x) @ Wqkv)[:, :Q] @ Wo, then x += (gate * up) @ Wdown with
    gate, up = norm(x) @ Wgate_up, then norm(norm(x) @ Wunembed)[:, :D], which feeds
    the next step (as the chosen token's embedding would). Without: the products alone,
    each output (sliced to the next weight's input) the next one's input. Attention is
    left out: the chain times the weight products."""
    q = w["o"][0].shape[0]
    f = w["down"][0].shape[0]
    d = x.shape[1]
    if not glue:
        for i in range(len(w["qkv"])):
            x = (x @ w["qkv"][i])[:, :q] @ w["o"][i]
            x = (x @ w["gate_up"][i])[:, :f] @ w["down"][i]
        return (x @ w["unembed"])[:, :d]

    def norm(h: Any) -> Any:
        return h / xp.sqrt((h * h).mean(-1, keepdims=True) + 1e-5)

    for i in range(len(w["qkv"])):
        x = x + (norm(x) @ w["qkv"][i])[:, :q] @ w["o"][i]
        g = norm(x) @ w["gate_up"][i]
        x = x + (g[:, :f] * g[:, f:]) @ w["down"][i]
    return norm(norm(x) @ w["unembed"])[:, :d]


def chain_flops(w: dict[str, Any], rows: int) -> float:
    """Matmul FLOPs of one chain_step on `rows` rows (the slice [:, :Q] of q/k/v counted
    whole: the fused product computes k and v too)."""
    mats = [*w["qkv"], *w["o"], *w["gate_up"], *w["down"], w["unembed"]]
    return 2.0 * rows * sum(m.shape[0] * m.shape[1] for m in mats)


CHAIN_ROWS = {  # family: (glue, product)
    "decode chain": (False, "one decode step's products in order, {L} layers + unembedding"),
    "decode chain, with glue": (True, "the same with RMS norms, gating and residual adds"),
}


def _time_decode_chain(family: str, steps: int, calls: int) -> dict[str, Any]:
    """A CHAIN_ROWS row: `steps` chain_steps on bench_sampler's 64 rows, XLA in one
    jitted fori_loop, PyTorch eagerly under inference_mode; ms per step. The two
    sides' results are compared over a call of min(steps, CHECK_STEPS) steps."""
    import jax
    import jax.numpy as jnp
    import torch

    from benchmarks import bench_sampler

    glue, product = CHAIN_ROWS[family]
    c = bench_sampler.HF_CONFIG
    rows = bench_sampler.MODELS["tiny"][1] * bench_sampler.MODELS["tiny"][2]
    rs = np.random.RandomState(1)
    w = chain_weights(rs)
    x0 = rs.randn(rows, c["hidden_size"]).astype(np.float32)
    jw, tw = jax.tree.map(jnp.asarray, w), jax.tree.map(torch.from_numpy, w)
    jx, tx = jnp.asarray(x0), torch.from_numpy(x0)

    @functools.partial(jax.jit, static_argnums=0)
    def xla(n: int, w: dict[str, Any], x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, n, lambda _, h: chain_step(h, w, jnp, glue), x)

    def ours(n: int = steps) -> jax.Array:
        return jax.block_until_ready(xla(n, jw, jx))

    @torch.inference_mode()
    def theirs(n: int = steps) -> torch.Tensor:
        h = tx
        for _ in range(n):
            h = chain_step(h, tw, torch, glue)
        return h

    t_xla, t_torch = _blocks([ours, theirs], calls=calls, rounds=ROUNDS)
    check = min(steps, CHECK_STEPS)
    want = theirs(check).numpy()
    diff = float(np.abs(np.asarray(ours(check)) - want).max() / np.abs(want).max())
    flops = chain_flops(w, rows)
    return {
        "family": family,
        "product": product.format(L=c["num_hidden_layers"]),
        "m": rows,
        "steps": steps,
        "xla_ms": t_xla / steps * 1e3,
        "torch_ms": t_torch / steps * 1e3,
        "xla_gflops": round(flops * steps / t_xla / 1e9, 1),
        "torch_gflops": round(flops * steps / t_torch / 1e9, 1),
        "ratio": round(t_torch / t_xla, 3),
        "check_steps": check,
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
    for family in CHAIN_ROWS:
        steps = 8 if quick else CHAIN_STEPS
        results.append(_time_decode_chain(family, steps, calls=1 if quick else 3))
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
            "m x k x n": (
                f"{r['m']} rows, ms per step" if "steps" in r else f"{r['m']} x {r['k']} x {r['n']}"
            ),
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
        + f"\n\n{common.cpu_label(m)}; PyTorch {res['torch_threads']} threads; f32, best of "
        f"{ROUNDS} blocks of"
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
