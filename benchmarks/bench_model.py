"""Benchmark: Transformer forward+backward tokens/s and MFU on the default device.

Two shapes: the test-size tiny Llama and SmolLM2-135M (random weights, same
FLOPs as the real one; a full run times it also with remat and with unrolled
layers). One step is jit(grad(mean token cross-entropy)) over a
[B, T] batch. MFU = model FLOPs/s (PaLM convention, ModelConfig.flops_per_token:
6 * matmul params + 12 * L * Hq * Dh * T per token) / the f32 matmul peak
(jitted 2048^2 on CPU) measured in the same run, so the ratio compares across
machines even where absolute tokens/s do not.

  python -m benchmarks.bench_model [--quick] [--out runs/bench/model.json]
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import common
from gdpo_jax.models import ModelConfig, create_model

DEFAULT_OUT = "runs/bench/model.json"
SMOLLM2_135M = ModelConfig(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def _cases(quick: bool) -> list[tuple[str, ModelConfig, int, int]]:
    """(name, config, batch, seq_len)."""
    tiny = ModelConfig.tiny()
    if quick:
        return [("tiny", tiny, 8, 64), ("smollm2-135m", SMOLLM2_135M, 1, 64)]
    return [
        ("tiny", tiny, 16, 128),
        ("smollm2-135m", SMOLLM2_135M, 2, 256),
        ("smollm2-135m+remat", SMOLLM2_135M.replace(remat=True), 2, 256),
        ("smollm2-135m+unrolled", SMOLLM2_135M.replace(scan_layers=False), 2, 256),
    ]


def bench_train_step(cfg: ModelConfig, batch: int, seq_len: int, *, repeats: int) -> dict[str, Any]:
    """Times one jitted forward+backward step; returns tokens/s and FLOP/s."""
    model = create_model(cfg)
    graphdef, params = nnx.split(model)
    rs = np.random.RandomState(0)
    ids = jnp.asarray(rs.randint(0, cfg.vocab_size, (batch, seq_len + 1)), jnp.int32)

    def loss_fn(params, ids):
        logits = nnx.merge(graphdef, params)(ids[:, :-1])
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

    step = jax.jit(jax.value_and_grad(loss_fn))
    t0 = time.perf_counter()
    jax.block_until_ready(step(params, ids))
    compile_s = time.perf_counter() - t0
    t = common.time_fn(lambda: jax.block_until_ready(step(params, ids)), repeats=repeats, warmup=0)
    tokens = batch * seq_len
    flops = cfg.flops_per_token(seq_len, training=True) * tokens
    return {
        "params_m": round(cfg.num_params() / 1e6, 3),
        "batch": batch,
        "seq_len": seq_len,
        "compile_s": round(compile_s, 2),
        "step_s": round(t["best_s"], 4),
        "median_step_s": round(t["median_s"], 4),
        "tokens_per_s": round(tokens / t["best_s"], 1),
        "gflops_per_s": round(flops / t["best_s"] / 1e9, 2),
    }


def run(quick: bool = False) -> dict:
    """Peak matmul + each case; returns a JSON-able dict (used by benchmarks/run_all.py)."""
    repeats = 2 if quick else 3
    peak = common.matmul_peak(repeats=repeats)
    rows = []
    for name, cfg, batch, seq_len in _cases(quick):
        r = bench_train_step(cfg, batch, seq_len, repeats=repeats)
        r["mfu"] = round(r["gflops_per_s"] / peak["gflops_per_s"], 4)
        rows.append({"model": name, **r})
    return {
        "benchmark": "model",
        "quick": quick,
        "machine": common.machine_info(),
        "matmul_peak_gflops": peak["gflops_per_s"],
        "matmul_peak": peak,
        "repeats": repeats,
        "results": rows,
    }


def format_table(result: dict) -> str:
    head = (
        f"Transformer forward+backward (f32) on {result['machine'].get('backend')}; "
        f"matmul peak {result['matmul_peak_gflops']:.1f} GFLOP/s "
        f"(f32 {result['matmul_peak']['n']}^2); best of {result['repeats']}"
    )
    cols = [
        "model",
        "params_m",
        "batch",
        "seq_len",
        "tokens_per_s",
        "gflops_per_s",
        "mfu",
        "step_s",
        "compile_s",
    ]
    return head + "\n" + common.text_table(result["results"], cols)


def main() -> None:
    common.quick_out_main(__doc__, run, format_table, DEFAULT_OUT, "Smaller shapes, fewer repeats.")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
