r"""The decode loop's forms, timed against each other in one process.

``Sampler(decode_layers=...)`` (gdpo_jax/sampling/decode.py): "scan" runs the
layers under one ``lax.scan`` over the stacked cache and weights; "unrolled"
carries one cache buffer per layer and slices the weights once per call;
"fused" also concatenates q/k/v and gate/up once per call. These three read
each prompt's KV cache once for its G rows (``share_prompt_cache``, the
default); "fused, prompt copied" is "fused" with a copy of the prompt's
cache in every row (``share_prompt_cache=False``). Each model's samplers are
called in turn (interleaved, so all see the same machine load), greedy,
every row decoding the full budget; tokens are checked equal to the scan's.
Two models with random weights:

* bench_sampler's (hidden 256, 4 layers, vocab 2048): 8 prompts of 24 tokens
  x 8 generations, 128 new tokens;
* SmolLM2-135M's shapes (hidden 576, 30 layers, vocab 49152, tied): 4 prompts
  of 100 tokens x 4 generations, 64 new tokens.

With --trace, also the milliseconds per decode step by kind of XLA:CPU
operation for the scan and the fused form on the first model, from a
jax.profiler trace of one call each (`xla_trace.op_breakdown`, as profile_step uses):
``dynamic-slice_*`` fusions are the per-step copies of each layer's weights and
cache slices out of the stacked arrays, ``ynn_fusion`` the YNNPACK matmuls.

    python -m benchmarks.profile_decode [--quick] [--trace] [--out runs/bench/profile_decode.json]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks import common

# form -> Sampler keyword arguments
FORMS: dict[str, dict[str, Any]] = {
    "scan": dict(decode_layers="scan"),
    "unrolled": dict(decode_layers="unrolled"),
    "fused": dict(decode_layers="fused"),
    "fused, prompt copied": dict(decode_layers="fused", share_prompt_cache=False),
}
MODELS = {
    "bench_sampler's model": dict(
        shape=dict(
            vocab_size=2048,
            hidden_size=256,
            intermediate_size=768,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            tie_word_embeddings=False,
        ),
        prompts=8,
        prompt_len=24,
        group=8,
        new_tokens=128,
    ),
    "SmolLM2-135M shapes": dict(
        shape=dict(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_layers=30,
            num_heads=9,
            num_kv_heads=3,
            head_dim=64,
            tie_word_embeddings=True,
        ),
        prompts=4,
        prompt_len=100,
        group=4,
        new_tokens=64,
    ),
}


def _profile_model(
    spec: dict[str, Any], repeats: int, quick: bool, trace: bool = False
) -> dict[str, Any]:
    import jax

    from gdpo_jax.models.config import ModelConfig
    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.sampling import Sampler, SamplingParams

    cfg = ModelConfig(
        **spec["shape"],
        max_position_embeddings=1024,
        dtype="float32",
        param_dtype="float32",
    )
    model = create_model(cfg, seed=0)
    rng = np.random.default_rng(0)
    prompts = rng.integers(6, cfg.vocab_size, (spec["prompts"], spec["prompt_len"])).tolist()
    new = spec["new_tokens"] // (4 if quick else 1)
    params = SamplingParams(max_new_tokens=new, greedy=True)
    samplers = {f: Sampler(model, None, eos_token_ids=(), **kw) for f, kw in FORMS.items()}
    compile_s, tokens = {}, {}

    def call(form: str, i: int) -> Any:
        return samplers[form].generate(
            prompts, params, num_generations=spec["group"], key=jax.random.key(i)
        )

    for form in FORMS:
        t0 = time.perf_counter()
        tokens[form] = call(form, 0).completion_ids
        compile_s[form] = time.perf_counter() - t0
    times: dict[str, list[float]] = {f: [] for f in FORMS}
    for i in range(repeats):
        for form in FORMS:
            t0 = time.perf_counter()
            call(form, i)
            times[form].append(time.perf_counter() - t0)
    rows = spec["prompts"] * spec["group"]
    ops = {}
    if trace:
        from benchmarks.xla_trace import op_breakdown

        for form in ("scan", "fused"):
            with tempfile.TemporaryDirectory() as tmp:
                jax.profiler.start_trace(tmp, create_perfetto_trace=True)
                call(form, 0)
                jax.profiler.stop_trace()
                ops[form] = op_breakdown(tmp, steps=new)
    return {
        "op_ms_per_step": ops,
        "rows": rows,
        "new_tokens": new,
        "layers": cfg.num_layers,
        "forms": {
            f: {
                "best_s": min(times[f]),
                "median_s": statistics.median(times[f]),
                "first_call_s": compile_s[f],
                "tokens_equal_scan": bool(np.array_equal(tokens[f], tokens["scan"])),
            }
            for f in FORMS
        },
    }


def run(quick: bool = False, trace: bool = False) -> dict[str, Any]:
    repeats = 2 if quick else 6
    first = next(iter(MODELS))
    return {
        "benchmark": "profile_decode",
        "repeats": repeats,
        "models": {
            name: _profile_model(
                spec, repeats if name == first else repeats // 2, quick, trace and name == first
            )
            for name, spec in MODELS.items()
        },
    }


def table_markdown(res: dict) -> str:
    """The markdown table of a run (docs/benchmarks.md shows the committed run's)."""
    rows = []
    for name, m in res["models"].items():
        scan = m["forms"]["scan"]
        for form, r in m["forms"].items():
            rows.append(
                {
                    "model (rows x new tokens)": f"{name} ({m['rows']} x {m['new_tokens']})",
                    "decode form": form,
                    "median s": f"{r['median_s']:.3f}",
                    "best s": f"{r['best_s']:.3f}",
                    "vs scan (median)": f"{scan['median_s'] / r['median_s']:.2f}x",
                    "first call s": f"{r['first_call_s']:.1f}",
                    "tokens = scan's": "yes" if r["tokens_equal_scan"] else "NO",
                }
            )
    lines = [common.markdown_table(rows)]
    m = res.get("machine", {})
    lines.append(
        f"\n{common.cpu_label(m)}; "
        f"greedy, interleaved calls ({res['repeats']} per form on the first model, "
        f"{res['repeats'] // 2} on the second); first call includes compilation."
    )
    return "\n".join(lines)


def trace_table_markdown(res: dict) -> str:
    """Milliseconds per decode step by operation kind, scan vs fused (--trace runs)."""
    name, m = next(iter(res["models"].items()))
    ops = m["op_ms_per_step"]
    kinds = list(dict.fromkeys([*ops["scan"], *ops["fused"]]))
    rows = [
        {
            "operation kind": f"`{k}`",
            "scan ms/step": f"{ops['scan'].get(k, 0.0):.1f}",
            "fused ms/step": f"{ops['fused'].get(k, 0.0):.1f}",
        }
        for k in kinds
    ]
    return (
        common.markdown_table(rows)
        + f"\n\n{name}, one traced call per form, {m['new_tokens']} decode steps; the 8 largest "
        "kinds of each (0.0: not among them); the trace slows a step a little."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--trace", action="store_true", help="add the per-operation breakdown")
    ap.add_argument("--out", default="runs/bench/profile_decode.json")
    a = ap.parse_args()
    common.check_out(ap, a.out, "--out", is_dir=False)  # before the run
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()
    res = run(a.quick, a.trace)
    res["machine"] = common.machine_info()
    print(table_markdown(res))
    if a.trace:
        print("\n" + trace_table_markdown(res))
    print(f"wrote {common.write_json(a.out, res)}")


if __name__ == "__main__":
    main()
