r"""Where a decode step's time goes, by product: bench_sampler's greedy decode
(the fused form, 64 rows x 128 new tokens) traced once, and each XLA:CPU
operation of the trace named after what it computes.

A jax.profiler trace names operations by their HLO instruction
(``ynn_fusion.101``). The optimized HLO, dumped with ``--xla_dump_to`` (this
script sets it for its own process), gives each instruction's output shape and
the jax operation it comes from (its ``op_name`` metadata: a dot's einsum
spec, ``reduce_max``, ...). `categorize` maps them to

* the weight products, by output width: q/k/v (fused), o and down (both
  ``[rows, D]``), gate/up (fused), the unembedding (the prefill's unfused
  products count where their width falls, or as "other widths");
* the attention dots, by einsum: the rows' own slots or the shared prompt's,
  ``q @ k`` or ``p @ v`` (gdpo_jax/models/attention.py);
* YNNPACK's reductions (the softmax's max and sum, the RMS norms' sums);
* everything else ("other").

Milliseconds per decode step are the traced call's totals over its steps
(prefill included, and the trace slows a step a little), with operations that
XLA:CPU runs side by side sharing their time (`xla_trace.op_ms_shared`); the
weight products also get the FLOP/s they ran at (FLOPs from the HLO's shapes).
The wall time of untraced calls is reported beside them.

    python -m benchmarks.profile_decode_ops [--quick] [--out runs/bench/decode_ops.json]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks import common, xla_trace

DEFAULT_OUT = "runs/bench/decode_ops.json"
MODULE = "generate"  # the Sampler's jitted function (its HLO module's name holds it)
# einsum spec -> category (gdpo_jax/models/attention.py's dots)
ATTENTION = {
    "bkqd,bkds->bkqs": "attention, own slots: q @ k",
    "bkqs,bksd->bkqd": "attention, own slots: p @ v",
    "ukmd,ukds->ukms": "attention, shared prompt: q @ k",
    "ukms,uksd->ukmd": "attention, shared prompt: p @ v",
}
WEIGHT_SPEC = "...d,df->...f"  # gdpo_jax/core/dense.py's product
REDUCTIONS = "reductions (YNNPACK)"
OTHER_WIDTHS = "weight products, other widths"  # a width weight_widths does not name
OTHER = "other"


def weight_widths(hf_config: dict[str, Any]) -> dict[int, str]:
    """Output width -> weight product, for the fused decode of an HF-style config."""
    c, dh = hf_config, hf_config["head_dim"]
    return {
        (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * dh: "q/k/v (fused)",
        c["hidden_size"]: "o and down projections",
        2 * c["intermediate_size"]: "gate/up (fused)",
        c["vocab_size"]: "unembedding",
    }


def categorize(hlo: str, widths: dict[int, str]) -> dict[str, str]:
    """{HLO instruction name: category} for every instruction of an optimized HLO
    module's text that carries op_name metadata (see the module docstring)."""
    out = {}
    for name, ins in xla_trace.instructions(hlo).items():
        op = ins.op_name
        if not op:
            continue
        spec = next((s for s in ATTENTION if s in op), None)
        if spec:
            out[name] = ATTENTION[spec]
        elif WEIGHT_SPEC in op:
            out[name] = widths.get(ins.dims[-1] if ins.dims else 0, OTHER_WIDTHS)
        elif name.startswith("ynn_fusion") and op.rsplit("/", 1)[-1].startswith("reduce_"):
            out[name] = REDUCTIONS
        else:
            out[name] = OTHER
    return out


def by_category(op_ms: dict[str, float], categories: dict[str, str], steps: int) -> dict:
    """Milliseconds per step by category (largest first); traced operations the
    HLO does not name count as "other"."""
    total: collections.Counter = collections.Counter()
    for name, ms in op_ms.items():
        total[categories.get(name, OTHER)] += ms / steps
    return {k: round(v, 3) for k, v in total.most_common()}


def rates(
    op_ms: dict[str, float], calls: dict[str, int], categories: dict[str, str], hlo: str
) -> dict[str, float]:
    """GFLOP/s of each weight-product category over its milliseconds (`calls`: how often
    each operation ran; FLOPs from the HLO's shapes, `xla_trace.dot_flops`)."""
    weights = set(categories.values()) - set(ATTENTION.values()) - {REDUCTIONS, OTHER}
    return xla_trace.rates(op_ms, calls, categories, hlo, weights)


def run(quick: bool = False, dump_dir: str = "") -> dict[str, Any]:
    """Times and traces the decode; dump_dir: where this process's XLA dumps its HLO."""
    import jax

    from benchmarks import bench_sampler
    from benchmarks.profile_decode import MODELS
    from gdpo_jax.models.config import ModelConfig
    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.sampling import Sampler, SamplingParams

    spec = MODELS["bench_sampler's model"]  # bench_sampler's model and call
    cfg = ModelConfig(
        **spec["shape"], max_position_embeddings=1024, dtype="float32", param_dtype="float32"
    )
    model = create_model(cfg, seed=0)
    rng = np.random.default_rng(0)
    prompts = rng.integers(6, cfg.vocab_size, (spec["prompts"], spec["prompt_len"])).tolist()
    group, new = spec["group"], spec["new_tokens"] // (4 if quick else 1)
    sampler = Sampler(model, None, eos_token_ids=(), decode_layers="fused")
    params = SamplingParams(max_new_tokens=new, greedy=True)

    def call(i: int) -> Any:
        return sampler.generate(prompts, params, num_generations=group, key=jax.random.key(i))

    call(0)
    walls = []
    for i in range(2 if quick else 6):
        t0 = time.perf_counter()
        call(i)
        walls.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp, create_perfetto_trace=True)
        call(0)
        jax.profiler.stop_trace()
        ops, durations, calls = xla_trace.op_times(tmp)
        summed = sum(durations.values()) / new
    hlo = xla_trace.module_hlo(dump_dir, MODULE, set(ops))
    cats = categorize(hlo, weight_widths(bench_sampler.HF_CONFIG))
    ms = by_category(ops, cats, new)
    return {
        "benchmark": "profile_decode_ops",
        "quick": quick,
        "rows": len(prompts) * group,
        "new_tokens": new,
        "wall_best_ms_per_step": round(min(walls) / new * 1e3, 3),
        "wall_median_ms_per_step": round(statistics.median(walls) / new * 1e3, 3),
        "traced_ms_per_step": round(sum(ms.values()), 3),
        "summed_ms_per_step": round(summed, 3),
        "ms_per_step": ms,
        "gflops": rates(ops, calls, cats, hlo),
        "other_kinds_ms_per_step": xla_trace.other_kinds(ops, cats, new),
    }


def table_markdown(res: dict[str, Any]) -> str:
    """The markdown table of a run (docs/benchmarks.md shows the committed run's)."""
    total = res["traced_ms_per_step"]
    gflops = res.get("gflops", {})
    rows = [
        {
            "part of the step": k,
            "ms per step": f"{v:.2f}",
            "share": f"{v / total:.0%}",
            "GFLOP/s": f"{gflops[k]:.0f}" if k in gflops else "",
        }
        for k, v in res["ms_per_step"].items()
    ]
    m = res.get("machine", {})
    return (
        common.markdown_table(rows)
        + f"\n\n{common.cpu_label(m)}; bench_sampler's model, greedy, fused form, "
        f"{res['rows']} rows x "
        f"{res['new_tokens']} new tokens; one traced call: operations ran {total:.2f} ms per "
        f"step (prefill included; concurrent ones sharing the time, their durations sum to "
        f"{res['summed_ms_per_step']:.2f}); untraced calls "
        f"{res['wall_best_ms_per_step']:.2f} ms per step "
        f"(best), {res['wall_median_ms_per_step']:.2f} (median). Largest kinds in other: "
        + ", ".join(f"`{k}` {v:.2f}" for k, v in res["other_kinds_ms_per_step"].items())
        + "."
    )


def main() -> None:
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers, as run_all's children
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    common.check_out(ap, args.out, "--out", is_dir=False)  # before the run
    with xla_trace.hlo_dump(MODULE, prefix="decode_ops_hlo_") as dump:  # before JAX's backend
        res = run(args.quick, dump) | {"machine": common.machine_info()}
    common.write_json(args.out, res)
    print(table_markdown(res))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
