"""Benchmark: top-k through blocks (`gdpo_jax.sampling.topk`) against one `jax.lax.top_k`.

64 rows of synthetic logits (N(0, 3^2)) at vocabularies from 2,048 to 151,936, for
k = 50 (transformers' default top-k) and k = 64 (top-p's candidates,
`filters.NUCLEUS_CANDIDATES`). At every vocabulary both forms run, the blocks at the
width `topk.block_width` gives without its minimum vocabulary (`width`); `chosen` is the
form `topk.top_k` takes there on a CPU. Each side runs `steps` selections in one jitted
loop (the logits nudged by the previous step's values, so nothing is hoisted out of
it), timed interleaved; ms per selection, best of the repeats. `same` says whether both
returned the same values and ids, ties and their order included.

Then the token choice it serves: `sample_tokens` in top-k 50 and top-p 0.95 modes at
8,192, 49,152 and 151,936 tokens, on bench_token_choice's synthetic logits ("flat",
"peaked", "mixed"), in both forms: each compiled ahead of time, the one-TopK form (before
the blocks) with `topk.BLOCKS_MIN_VOCAB` above every vocabulary while it is traced
(`common.compiled_with`), then the two executables timed in turn in this process.
`same_tokens` is the fraction of rows where both chose the same token at the first
step; `top_k_calls` the TopK custom calls in each compiled program.

    python -m benchmarks.bench_top_k [--quick] [--out runs/bench/top_k.json]
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from gdpo_jax.sampling import topk
from gdpo_jax.sampling.filters import NUCLEUS_CANDIDATES

ROWS = 64
VOCABS = (2048, 4096, 8192, 16384, 32000, 49152, 128256, 151936)
KS = (50, NUCLEUS_CANDIDATES)
DEFAULT_OUT = "runs/bench/top_k.json"
SAMPLE_VOCABS = (8192, 49152, 151936)
SAMPLE_MODES = {"top-k 50": (50, None), "top-p 0.95": (0, 0.95)}


def _loop(select: Callable, k: int, steps: int) -> Callable:
    """jit(z) -> (first step's values, ids; a checksum): `steps` selections."""

    def run(z: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        def body(t: jax.Array, c: tuple) -> tuple:
            vals0, ids0, acc = c
            vals, ids = select(z + 1e-3 * acc[:, None], k)
            first = t == 0
            # A reduction, not a slice: slicing top_k's output makes XLA:CPU lower
            # it to a sort of the whole row (filters.top_k_candidates).
            nudge = jnp.min(vals, axis=-1)
            return jnp.where(first, vals, vals0), jnp.where(first, ids, ids0), acc + nudge

        init = (
            jnp.zeros((z.shape[0], k), z.dtype),
            jnp.zeros((z.shape[0], k), jnp.int32),
            jnp.zeros(z.shape[0], z.dtype),
        )
        return jax.lax.fori_loop(0, steps, body, init)

    return jax.jit(run)


def _sampling(quick: bool) -> list[dict[str, Any]]:
    """`sample_tokens` through blocks and with one TopK, per vocabulary, logits and mode."""
    from benchmarks.bench_token_choice import SHAPES, synthetic_logits
    from benchmarks.bench_token_choice import _loop as choice_loop
    from gdpo_jax.sampling.filters import sample_tokens

    if quick:
        vocabs, shapes, steps, repeats = (16384,), ("peaked",), 2, 1
    else:
        vocabs, shapes, steps, repeats = SAMPLE_VOCABS, SHAPES, 8, 3
    key = jax.random.key(0)
    rows = []
    for v in vocabs:
        for shape in shapes:
            z = synthetic_logits(shape, ROWS, v)
            for mode, (top_k, top_p) in SAMPLE_MODES.items():
                f = choice_loop(
                    lambda z, k, tk=top_k, tp=top_p: sample_tokens(z, k, 1.0, tp, top_k=tk), steps
                )
                (blocks, _), (one, _) = (
                    common.compiled_with(topk, "BLOCKS_MIN_VOCAB", least, f, z, key)
                    for least in (topk.BLOCKS_MIN_VOCAB, sys.maxsize)
                )
                a, b = (jax.block_until_ready(c(z, key))[0] for c in (blocks, one))
                t_blocks, t_one = common.time_interleaved(
                    [lambda c=c, z=z: jax.block_until_ready(c(z, key)) for c in (blocks, one)],
                    repeats=repeats,
                )
                rows.append(
                    {
                        "vocab": v,
                        "logits": shape,
                        "mode": mode,
                        "blocks_ms": round(1e3 * t_blocks["best_s"] / steps, 3),
                        "one_top_k_ms": round(1e3 * t_one["best_s"] / steps, 3),
                        "speedup": round(t_one["best_s"] / t_blocks["best_s"], 2),
                        "same_tokens": float(np.mean(np.asarray(a) == np.asarray(b))),
                        "top_k_calls": [
                            c.as_text().count('custom_call_target="TopK"') for c in (blocks, one)
                        ],
                    }
                )
    return rows


def run(quick: bool = False) -> dict[str, Any]:
    vocabs, steps, repeats = ((2048, 16384), 2, 1) if quick else (VOCABS, 8, 5)
    out = []
    for v in vocabs:
        z = jax.random.normal(jax.random.key(v), (ROWS, v), jnp.float32) * 3.0
        for k in KS:
            width = topk.block_width(v, k, min_vocab=0)
            blocks = _loop(functools.partial(topk.top_k_by_blocks, width=width), k, steps)
            ref = _loop(lambda z, k: tuple(jax.lax.top_k(z, k)), k, steps)
            a, b = jax.block_until_ready(blocks(z)), jax.block_until_ready(ref(z))
            t_blocks, t_ref = common.time_interleaved(
                [lambda f=f, z=z: jax.block_until_ready(f(z)) for f in (blocks, ref)],
                repeats=repeats,
            )
            same = all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))
            out.append(
                {
                    "vocab": v,
                    "k": k,
                    "width": width,
                    "blocks_ms": round(1e3 * t_blocks["best_s"] / steps, 3),
                    "top_k_ms": round(1e3 * t_ref["best_s"] / steps, 3),
                    "speedup": round(t_ref["best_s"] / t_blocks["best_s"], 2),
                    "chosen": "blocks" if topk.block_width(v, k) else "top_k",
                    "same": same,
                }
            )
    return {
        "benchmark": "top_k",
        "quick": quick,
        "machine": common.machine_info(),
        "rows": ROWS,
        "steps": steps,
        "repeats": repeats,
        "command": common.command_line(),
        "date": common.now_iso(),
        "results": out,
        "sampling": _sampling(quick),
    }


def format_table(result: dict) -> str:
    head = (
        f"top-k through blocks vs one jax.lax.top_k, {result['rows']} rows, ms per selection "
        f"({result['steps']} in one loop, best of {result['repeats']}); "
        f"{common.describe_machine(result['machine'])}"
    )
    cols = ["vocab", "k", "width", "blocks_ms", "top_k_ms", "speedup", "chosen", "same"]
    cols_s = ["vocab", "logits", "mode", "blocks_ms", "one_top_k_ms", "speedup", "same_tokens"]
    return (
        head
        + "\n\n"
        + common.markdown_table(result["results"], cols)
        + "\n\nsample_tokens, both forms timed in turn, ms per choice:\n\n"
        + common.markdown_table(result["sampling"], cols_s)
    )


def main() -> None:
    common.quick_out_main(
        __doc__, run, format_table, DEFAULT_OUT, "Two small vocabularies, 2 steps, 1 repeat."
    )


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
