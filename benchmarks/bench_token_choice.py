"""Benchmark: one decode step's token choice (`sample_tokens`) against the forms it replaced.

64 rows of next-token logits at three vocabulary sizes: 2,048 (bench_sampler's model),
49,152 (SmolLM2) and 151,936 (the paper's Qwen models); three synthetic logit shapes:
"flat" (N(0, 3^2), like a random-init model: a 0.95 nucleus of thousands of tokens),
"peaked" (N(0, 8^2): a nucleus of at most a few dozen, as a trained model's at T 0.6) and
"mixed" (peaked, but one row in 32 flat: a few rows whose nucleus lies beyond top-p's
candidates, as in a trained model's batches).
Modes: plain sampling, top-p 0.95 and top-k 50, each against the form the sampler used
before 2026-11-27, written here as the reference: one cumsum over the vocabulary for the
inverse CDF, 32 bisection steps for every top-p row, and top-k shifted by a slice of
`top_k`'s output (which XLA:CPU lowers to a vocabulary sort). Both sides run `steps`
choices in one jitted loop (logits nudged by the previous step's log-probs, so nothing is
hoisted out of it), timed interleaved; ms per choice, best of the repeats. `same_tokens`
is the fraction of rows where both choose the same token (1 up to f32 rounding of sums).

  python -m benchmarks.bench_token_choice [--quick] [--out runs/bench/token_choice.json]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from gdpo_jax.sampling.filters import _sortable_key, row_keys, sample_tokens

ROWS = 64
VOCABS = (2048, 49152, 151936)
SHAPES = ("flat", "peaked", "mixed")
MODES = {"sampled": (0, None), "top-p 0.95": (0, 0.95), "top-k 50": (50, None)}
DEFAULT_OUT = "runs/bench/token_choice.json"


# --------------------------------------------------------------------------- #
# The replaced forms (reference only).
# --------------------------------------------------------------------------- #
def _cumsum_inverse_cdf(keys: jax.Array, w: jax.Array) -> jax.Array:
    cdf = jnp.cumsum(w, axis=-1)
    total = cdf[:, -1:]
    u = jax.vmap(lambda k: jax.random.uniform(k, (1,), jnp.float32))(keys) * total
    idx = jnp.sum(cdf <= u, axis=-1)
    return jnp.minimum(idx, jnp.sum(cdf < total, axis=-1)).astype(jnp.int32)


def _bisection_nucleus(z: jax.Array, p: jax.Array, top_p: float) -> jax.Array:
    target = top_p * jnp.sum(p, axis=-1)
    kz = _sortable_key(z)
    lo, hi = jnp.min(kz, axis=-1) - 1, jnp.max(kz, axis=-1)

    def body(_: int, c: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        lo, hi = c
        mid = lo + (hi - lo) // 2
        ok = jnp.sum(jnp.where(kz > mid[:, None], p, 0.0), axis=-1) < target
        return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

    _, hi = jax.lax.fori_loop(0, 32, body, (lo, hi))
    return kz >= hi[:, None]


def reference_sample_tokens(
    logits: jax.Array, keys: jax.Array, top_k: int, top_p: float | None
) -> tuple[jax.Array, jax.Array]:
    """`sample_tokens` at temperature 1 as it was: tokens i32[B], logp f32[B]."""
    z = logits - jnp.max(logits, axis=-1, keepdims=True)
    p = jnp.exp(z)
    if top_k:
        vals, ids = jax.lax.top_k(z, top_k)
        j = _cumsum_inverse_cdf(keys, jnp.exp(vals - vals[:, :1]))
        tokens = jnp.take_along_axis(ids, j[:, None], axis=-1)[:, 0]
    else:
        if top_p is not None:
            p = jnp.where(_bisection_nucleus(z, p, top_p), p, 0.0)
        tokens = _cumsum_inverse_cdf(keys, p)
    logp = jnp.take_along_axis(z, tokens[:, None], axis=-1)[:, 0] - jnp.log(jnp.sum(jnp.exp(z), -1))
    return tokens.astype(jnp.int32), logp


# --------------------------------------------------------------------------- #
def synthetic_logits(shape: str, rows: int, vocab: int) -> jax.Array:
    """f32[rows, vocab] logits of one of `SHAPES`."""
    z = jax.random.normal(jax.random.key(1), (rows, vocab), jnp.float32)
    if shape == "flat":
        return z * 3.0
    z = z * 8.0
    return z.at[::32].multiply(3.0 / 8.0) if shape == "mixed" else z


def _loop(choose: Callable[..., tuple[jax.Array, jax.Array]], steps: int) -> Callable:
    """jit(z, key) -> (first step's tokens, logp sum): `steps` choices in a fori_loop."""

    def run(z: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        rows = jnp.arange(z.shape[0], dtype=jnp.int32)

        def body(t: jax.Array, c: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            first, acc = c
            tok, lp = choose(z + 1e-3 * acc[:, None], row_keys(key, rows, t))
            return jnp.where(t == 0, tok, first), acc + lp

        init = (jnp.zeros(z.shape[0], jnp.int32), jnp.zeros(z.shape[0], jnp.float32))
        return jax.lax.fori_loop(0, steps, body, init)

    return jax.jit(run)


def run(quick: bool = False) -> dict[str, Any]:
    vocabs, steps, repeats = ((2048,), 2, 1) if quick else (VOCABS, 8, 3)
    key = jax.random.key(0)
    rows_out = []
    for v in vocabs:
        for shape in SHAPES:
            z = synthetic_logits(shape, ROWS, v)
            for mode, (top_k, top_p) in MODES.items():
                ours = _loop(
                    lambda z, k, tk=top_k, tp=top_p: sample_tokens(z, k, 1.0, tp, top_k=tk), steps
                )
                ref = _loop(
                    lambda z, k, tk=top_k, tp=top_p: reference_sample_tokens(z, k, tk, tp), steps
                )
                a, b = jax.block_until_ready(ours(z, key)), jax.block_until_ready(ref(z, key))
                t_ours, t_ref = common.time_interleaved(
                    [lambda f=f, z=z: jax.block_until_ready(f(z, key)) for f in (ours, ref)],
                    repeats=repeats,
                )
                rows_out.append(
                    {
                        "vocab": v,
                        "logits": shape,
                        "mode": mode,
                        "ours_ms": round(1e3 * t_ours["best_s"] / steps, 3),
                        "reference_ms": round(1e3 * t_ref["best_s"] / steps, 3),
                        "speedup": round(t_ref["best_s"] / t_ours["best_s"], 2),
                        "same_tokens": float(np.mean(np.asarray(a[0]) == np.asarray(b[0]))),
                    }
                )
    return {
        "benchmark": "token_choice",
        "quick": quick,
        "machine": common.machine_info(),
        "rows": ROWS,
        "steps": steps,
        "repeats": repeats,
        "results": rows_out,
    }


def format_table(result: dict) -> str:
    head = (
        f"sample_tokens vs the replaced forms, {result['rows']} rows, T 1, ms per choice "
        f"({result['steps']} in one loop, best of {result['repeats']}); "
        f"{common.describe_machine(result['machine'])}"
    )
    cols = ["vocab", "logits", "mode", "ours_ms", "reference_ms", "speedup", "same_tokens"]
    return head + "\n\n" + common.markdown_table(result["results"], cols)


def main() -> None:
    common.quick_out_main(
        __doc__, run, format_table, DEFAULT_OUT, "One small vocabulary, 2 steps, 1 repeat."
    )


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
