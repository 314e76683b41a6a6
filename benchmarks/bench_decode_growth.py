r"""The decode phases' two growths on this CPU, timed against each other in one process.

``Sampler(decode_growth=...)`` (gdpo_jax/sampling/decode.py): "copy" starts
with phase 0's slots and copies the KV cache into a longer one at each phase;
"prefix" holds one cache of all slots and each phase reads a static prefix of
it (``KVCache.read_slots``). On TPU and GPU targets the compiled programs read
the prefix in place and "prefix" holds one cache instead of two at a phase
step (docs/scale.md); this script measures what each costs on XLA:CPU, for
the scan and the fused decode form, which decides `decode_growth_default`.

bench_sampler's model shapes (hidden 256, 4 layers, vocab 2048; random
weights, f32): 8 prompts of 24 tokens x 8 generations = 64 rows, 256 new
tokens in 4 phases of 64, greedy, every row decoding the full budget. The
four samplers are called in turn (interleaved, so all see the same machine
load); each form's "prefix" tokens are checked equal to its "copy" tokens.

    python -m benchmarks.bench_decode_growth [--quick] [--out runs/bench/decode_growth.json]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from benchmarks import common
from benchmarks.profile_decode import MODELS

DEFAULT_OUT = "runs/bench/decode_growth.json"
LAYERS = ("scan", "fused")
GROWTHS = ("copy", "prefix")
_SPEC = MODELS["bench_sampler's model"]  # profile_decode's first model and batch
SHAPE = _SPEC["shape"]
PROMPTS, PROMPT_LEN, GROUP = _SPEC["prompts"], _SPEC["prompt_len"], _SPEC["group"]
NEW_TOKENS, PHASES = 256, 4  # 4 phases of 64: a long enough decode for the phases to matter


def run(quick: bool = False) -> dict[str, Any]:
    import jax

    from gdpo_jax.models.config import ModelConfig
    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.sampling import Sampler, SamplingParams

    cfg = ModelConfig(**SHAPE, max_position_embeddings=1024, dtype="float32", param_dtype="float32")
    model = create_model(cfg, seed=0)
    rng = np.random.default_rng(0)
    prompts = rng.integers(6, cfg.vocab_size, (PROMPTS, PROMPT_LEN)).tolist()
    new = NEW_TOKENS // (4 if quick else 1)
    params = SamplingParams(max_new_tokens=new, greedy=True)
    forms = [(layers, growth) for layers in LAYERS for growth in GROWTHS]
    samplers = {
        f: Sampler(
            model,
            None,
            eos_token_ids=(),
            decode_layers=f[0],
            decode_growth=f[1],
            decode_chunks=PHASES,
        )
        for f in forms
    }

    def call(form: tuple[str, str], i: int) -> Any:
        return samplers[form].generate(
            prompts, params, num_generations=GROUP, key=jax.random.key(i)
        )

    first, tokens = {}, {}
    for f in forms:
        t0 = time.perf_counter()
        tokens[f] = call(f, 0).completion_ids
        first[f] = time.perf_counter() - t0
    repeats = 2 if quick else 6
    times: dict[tuple[str, str], list[float]] = {f: [] for f in forms}
    for i in range(repeats):
        for f in forms:
            t0 = time.perf_counter()
            call(f, i)
            times[f].append(time.perf_counter() - t0)
    return {
        "benchmark": "decode_growth",
        "machine": common.machine_info(),
        "rows": PROMPTS * GROUP,
        "new_tokens": new,
        "phases": PHASES,
        "repeats": repeats,
        "forms": {
            layers: {
                growth: {
                    "best_s": min(times[layers, growth]),
                    "median_s": statistics.median(times[layers, growth]),
                    "first_call_s": first[layers, growth],
                    "tokens_equal_copy": bool(
                        np.array_equal(tokens[layers, growth], tokens[layers, "copy"])
                    ),
                }
                for growth in GROWTHS
            }
            for layers in LAYERS
        },
    }


def table_markdown(res: dict) -> str:
    """The markdown table of a run (docs/benchmarks.md shows the committed run's)."""
    rows = []
    for layers, by_growth in res["forms"].items():
        copy = by_growth["copy"]
        for growth, r in by_growth.items():
            rows.append(
                {
                    "decode form": layers,
                    "growth": growth,
                    "median s": f"{r['median_s']:.3f}",
                    "best s": f"{r['best_s']:.3f}",
                    "time vs copy (median)": f"{r['median_s'] / copy['median_s']:.2f}x",
                    "first call s": f"{r['first_call_s']:.1f}",
                    "tokens = copy's": "yes" if r["tokens_equal_copy"] else "NO",
                }
            )
    m = res.get("machine", {})
    return common.markdown_table(rows) + (
        f"\n\n{common.cpu_label(m)}; {res['rows']} rows x {res['new_tokens']} new tokens in "
        f"{res['phases']} phases, "
        f"greedy, interleaved calls ({res['repeats']} per form); first call includes compilation."
    )


def main() -> None:
    common.quick_out_main(__doc__, run, table_markdown, DEFAULT_OUT)


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
