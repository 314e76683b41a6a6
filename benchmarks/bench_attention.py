"""Attention kernels side by side on this backend: error, fwd+bwd time, compiled memory.

One forward + backward of a Llama-family model (random init, f32 params, bf16
compute; SmolLM2-135M's config from benchmarks.bench_model, or ModelConfig.tiny()
with --quick and on CPU) over left-padded
rows, once per attention kernel that `model.attention` offers on the backend:

* GPU: "xla" (the grouped einsum path), "dpa" (jax.nn.dot_product_attention,
  XLA kernel) and "cudnn" (its cuDNN flash kernel);
* TPU: "xla" and "splash" (the Pallas splash kernel);
* CPU: "xla" and "dpa".

Error: each kernel's token log-probs and parameter gradients against the same
model run in f32 with the einsum path and full-precision matmuls (the
reference; on a GPU JAX's default precision for f32 is TF32; a run whose rows
carry no matmul_precision used the default for the reference too), as max |d logp| over
valid tokens and the gradients' relative L2 distance. A kernel is at parity
when its bf16 error is of the size of the einsum path's own bf16 error. Time:
median of jitted fwd+bwd calls (after one compiling call). Memory: the
compiled program's temporaries (``memory_analysis().temp_size_in_bytes``).

Sampler: the same kernels in the prefill of greedy sampling (the decode steps
read the cache through the einsum path whatever the kernel): left-padded
prompts x G generations, every row decoding the full budget; each kernel's
tokens and log-probs against the einsum path's in the same dtype, and the
median seconds per call.

    python -m benchmarks.bench_attention [--quick] [--out runs/bench/attention.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from gdpo_jax.models.config import ModelConfig

DEFAULT_OUT = "runs/bench/attention.json"
KINDS = {"gpu": ("xla", "dpa", "cudnn"), "tpu": ("xla", "splash"), "cpu": ("xla", "dpa")}


def _batch(B: int, T: int, vocab: int) -> tuple[jax.Array, jax.Array]:
    """ids i32[B,T], mask i32[B,T]: row b is left-padded by b*T/(2B) slots."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, vocab, (B, T)).astype(np.int32)
    pad = (np.arange(B) * T) // (2 * B)
    mask = (np.arange(T)[None, :] >= pad[:, None]).astype(np.int32)
    return jnp.asarray(ids), jnp.asarray(mask)


def _loss_fn(graphdef: Any):
    """(state, ids, mask) -> (loss, logp f32[B,T-1]): mean next-token log-prob."""
    from flax import nnx

    def loss(state, ids, mask):
        logits = nnx.merge(graphdef, state)(ids, mask)[:, :-1]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        logp = jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
        valid = mask[:, 1:] * mask[:, :-1]
        return -jnp.sum(logp * valid) / jnp.sum(valid), logp * valid

    return loss


def _rel_l2(a: Any, b: Any) -> float:
    da = jax.tree.leaves(jax.tree.map(lambda x, y: jnp.sum((x - y) ** 2), a, b))
    nb = jax.tree.leaves(jax.tree.map(lambda y: jnp.sum(y**2), b))
    return float(np.sqrt(sum(map(float, da)) / sum(map(float, nb))))


def _bytes(compiled: Any) -> float | None:
    try:
        return float(compiled.memory_analysis().temp_size_in_bytes)
    except Exception:  # some backends report no analysis
        return None


def run_shape(
    shape: ModelConfig, B: int, T: int, kinds: tuple[str, ...], repeats: int, log: Any = None
) -> list[dict]:
    """One row per kernel (plus the f32 reference) for a [B, T] batch; `log(row)`
    as each row is done."""
    from flax import nnx

    from gdpo_jax.models.sharding import abstract_model, create_model

    base = dataclasses.replace(shape, max_position_embeddings=max(T, 64), param_dtype="float32")
    ids, mask = _batch(B, T, base.vocab_size)
    _, state = nnx.split(create_model(dataclasses.replace(base, dtype="float32"), seed=0))
    ref = None
    rows = []
    for kind, dtype in [("xla", "float32")] + [(k, "bfloat16") for k in kinds]:
        cfg = dataclasses.replace(base, dtype=dtype, attention=kind)
        graphdef, _ = nnx.split(abstract_model(cfg))  # the kernel is in the graphdef's cfg
        step = jax.jit(jax.value_and_grad(_loss_fn(graphdef), has_aux=True))
        # The reference's matmuls in full f32: on GPUs JAX's default precision for
        # f32 is TF32 (a 10-bit mantissa).
        precision = "highest" if ref is None else "default"
        t0 = time.perf_counter()
        with jax.default_matmul_precision(precision):
            compiled = step.lower(state, ids, mask).compile()
        (loss, logp), grads = jax.block_until_ready(compiled(state, ids, mask))
        compile_s = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(state, ids, mask))
            times.append(time.perf_counter() - t0)
        row = {
            "batch": B,
            "seq": T,
            "attention": kind,
            "dtype": dtype,
            "matmul_precision": precision,
            "fwd_bwd_ms": 1e3 * statistics.median(times),
            "compile_s": compile_s,
            "temp_gib": None if (b := _bytes(compiled)) is None else b / 2**30,
            "loss": float(loss),
        }
        if ref is None:
            ref = (logp, grads)
            row |= {"max_dlogp_vs_f32": 0.0, "grad_rel_l2_vs_f32": 0.0}
        else:
            row["max_dlogp_vs_f32"] = float(jnp.max(jnp.abs(logp - ref[0])))
            row["grad_rel_l2_vs_f32"] = _rel_l2(grads, ref[1])
        rows.append(row)
        if log is not None:
            log(row)
        del compiled, grads
    return rows


def run_sampler(
    shape: ModelConfig, prompts: int, group: int, prompt_len: int, new: int, kinds: tuple[str, ...]
) -> list[dict]:
    """Greedy sampling with each kernel in the prefill (bf16 compute)."""
    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.sampling import Sampler, SamplingParams

    rng = np.random.default_rng(1)
    lens = rng.integers(prompt_len // 4, prompt_len + 1, prompts)
    batch = [rng.integers(3, shape.vocab_size, n).tolist() for n in lens]
    params = SamplingParams(max_new_tokens=new, greedy=True)
    rows, ref = [], None
    for kind in kinds:
        cfg = dataclasses.replace(
            shape,
            max_position_embeddings=prompt_len + new,
            dtype="bfloat16",
            param_dtype="float32",
            attention=kind,
        )
        sampler = Sampler(create_model(cfg, seed=0), None, eos_token_ids=())

        def call(i: int, sampler=sampler):
            return sampler.generate(batch, params, num_generations=group, key=jax.random.key(i))

        ro = call(0)  # compiles
        times = []
        for i in range(3):
            t0 = time.perf_counter()
            call(i)
            times.append(time.perf_counter() - t0)
        if ref is None:
            ref = ro
        same = np.all(ro.completion_ids == ref.completion_ids, axis=1)
        dlogp = np.abs(ro.logprobs - ref.logprobs)[same]
        rows.append(
            {
                "attention": kind,
                "rows": prompts * group,
                "prompt_len_max": int(lens.max()),
                "new_tokens": new,
                "call_s": statistics.median(times),
                "rows_same_tokens_as_xla": float(same.mean()),
                "max_dlogp_vs_xla": float(dlogp.max()) if dlogp.size else None,
            }
        )
    return rows


def run(quick: bool = False, log: Any = None) -> dict:
    """All kernels of this backend on its shapes; a JSON-able dict."""
    backend = jax.default_backend()
    kinds = KINDS.get(backend, ("xla",))
    if quick or backend == "cpu":  # SmolLM2 at these lengths is minutes per call on CPU
        shapes = [("tiny", ModelConfig.tiny(), 2, 64)]
    else:
        from benchmarks.bench_model import SMOLLM2_135M as smollm2

        shapes = [("smollm2-135m", smollm2, 8, 1024), ("smollm2-135m", smollm2, 2, 4096)]
    repeats = 3 if quick else 10
    rows = []
    for name, shape, B, T in shapes:
        for r in run_shape(shape, B, T, kinds, repeats, log):
            rows.append({"model": name} | r)
    name, shape, _, _ = shapes[0]
    sampling = run_sampler(shape, *((2, 2, 32, 8) if name == "tiny" else (4, 4, 1024, 64)), kinds)
    sampling = [{"model": name} | r for r in sampling]
    dev = jax.devices()[0]
    return {
        "benchmark": "attention",
        "quick": quick,
        "machine": common.machine_info(),
        "backend": backend,
        "device": getattr(dev, "device_kind", str(dev)),
        "jax": jax.__version__,
        "repeats": repeats,
        "results": rows,
        "sampling": sampling,
    }


def format_table(result: dict) -> str:
    cols = [
        "model",
        "batch",
        "seq",
        "attention",
        "dtype",
        *(["matmul_precision"] if "matmul_precision" in result["results"][0] else []),
        "fwd_bwd_ms",
        "temp_gib",
        "max_dlogp_vs_f32",
        "grad_rel_l2_vs_f32",
        "compile_s",
    ]
    head = (
        f"Attention kernels on {result['backend']} ({result['device']}, jax {result['jax']}); "
        f"fwd+bwd median of {result['repeats']}; errors against the f32 einsum path"
    )
    out = head + "\n" + common.markdown_table(result["results"], cols)
    if result.get("sampling"):
        out += "\n\nGreedy sampling, the kernel in the prefill (bf16); tokens and log-probs"
        out += " against the einsum path's\n"
        out += common.markdown_table(result["sampling"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON output path.")
    parser.add_argument("--quick", action="store_true", help="A tiny model, fewer repeats.")
    args = parser.parse_args()
    common.check_out(parser, args.out, "--out", is_dir=False)  # before the run
    res = run(args.quick, log=lambda row: print(row, flush=True))
    print(format_table(res))
    print(f"wrote {common.write_json(args.out, res)}")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
