"""Top-p's bisection in chunks of 1, 2, 4 or 8 rows against chunks of 8 only.

Off GPUs, `sample_tokens`' top-p bisects the rows whose nucleus lies beyond its 64
candidates, gathered from the batch (`filters._bisect_rows`). A gather takes as few of
`filters.BISECT_CHUNKS` rows as hold the rows still to bisect; before, it always took
`BISECT_ROWS` (8), so one wide row paid for eight. This probe times top-p 0.95 choices
(64 rows, T 1) on bench_token_choice's synthetic logits at 2,048, 49,152 and 151,936
tokens in both forms: each compiled ahead of time, the form before with
`BISECT_CHUNKS` set to `(BISECT_ROWS,)` while it is traced (`common.compiled_with`),
then the two executables timed in turn in this process. Each runs `steps` choices in
one compiled loop, best of the repeats, ms per choice; `same_tokens` is the fraction
of rows that chose the same token at the first step, and `loops` the while loops in
each lowered program (one bisection loop per chunk size, and the loops around them).

    python -m benchmarks.probe_bisect_chunks [--quick] [--out runs/bench/bisect_chunks.json]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks import common

DEFAULT_OUT = "runs/bench/bisect_chunks.json"
VOCABS = (2048, 49152, 151936)
TOP_P = 0.95


def run(quick: bool = False) -> dict[str, Any]:
    import jax

    from benchmarks.bench_token_choice import ROWS, SHAPES, _loop, synthetic_logits
    from gdpo_jax.sampling import filters

    if quick:
        vocabs, shapes, steps, repeats = (2048,), ("mixed",), 2, 1
    else:
        vocabs, shapes, steps, repeats = VOCABS, SHAPES, 8, 5
    key = jax.random.key(0)
    rows = []
    for v in vocabs:
        for shape in shapes:
            z = synthetic_logits(shape, ROWS, v)
            f = _loop(lambda z, k: filters.sample_tokens(z, k, 1.0, TOP_P), steps)
            (now, text_now), (before, text_before) = (
                common.compiled_with(filters, "BISECT_CHUNKS", chunks, f, z, key)
                for chunks in (filters.BISECT_CHUNKS, (filters.BISECT_ROWS,))
            )
            a, b = (jax.block_until_ready(c(z, key))[0] for c in (now, before))
            t_now, t_before = common.time_interleaved(
                [lambda c=c, z=z: jax.block_until_ready(c(z, key)) for c in (now, before)],
                repeats=repeats,
            )
            rows.append(
                {
                    "vocab": v,
                    "logits": shape,
                    "chunks_1_8_ms": round(1e3 * t_now["best_s"] / steps, 3),
                    "chunks_8_ms": round(1e3 * t_before["best_s"] / steps, 3),
                    "speedup": round(t_before["best_s"] / t_now["best_s"], 2),
                    "same_tokens": float(np.mean(np.asarray(a) == np.asarray(b))),
                    "loops": [t.count("stablehlo.while") for t in (text_now, text_before)],
                }
            )
    return {
        "benchmark": "bisect_chunks",
        "quick": quick,
        "top_p": TOP_P,
        "rows": ROWS,
        "steps": steps,
        "repeats": repeats,
        "chunks": list(filters.BISECT_CHUNKS),
        "machine": common.machine_info(),
        "command": common.command_line(),
        "date": common.now_iso(),
        "results": rows,
    }


def format_table(result: dict) -> str:
    head = (
        f"top-p {result['top_p']} choices, {result['rows']} rows: bisection chunks of 1-8 rows "
        f"vs 8, ms per choice ({result['steps']} in one loop, best of {result['repeats']}, "
        f"timed in turn); {common.describe_machine(result['machine'])}"
    )
    cols = ["vocab", "logits", "chunks_1_8_ms", "chunks_8_ms", "speedup", "same_tokens"]
    return head + "\n\n" + common.markdown_table(result["results"], cols)


def main() -> None:
    common.quick_out_main(__doc__, run, format_table, DEFAULT_OUT, "2,048 tokens, mixed logits.")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
