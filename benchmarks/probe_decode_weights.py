r"""The sampler's decode at a paper model's shapes: layer scan against the fused form,
f32 weights against weights cast to the compute dtype once per call.

    python -m benchmarks.probe_decode_weights                # R1-Distill-1.5B shapes (a GPU)
    python -m benchmarks.probe_decode_weights --tiny         # configs/tiny_cpu.py (a smoke run)

Random weights of `configs/paper_math.py:r1-distill-1.5b` (f32 params, bf16
compute), 4 prompts x G 16 = 64 rows, prompts of 512 tokens, 256 new tokens,
greedy, every row to the cap (no stop id). Three decode programs
(`decode.make_generate_fn` with the planner's sampler inputs, `scale/lowering.py`):

  scan_f32        DecodeSpec.layers="scan" on the f32 weights (each step casts
                  every weight it reads to bf16; the default on accelerators)
  scan_castonce   the same on weights cast to bf16 before the call
  fused           layers="fused" on the f32 weights: the call casts them to bf16
                  once (`decode.weights_in`) and concatenates q/k/v and gate/up
                  (the default on one GPU in bf16 / f16)

Each compiled once, then timed twice; the tokens and log-probs of each are
compared with scan_f32's (the trainer's numerics). Prints a timing line per
program (the best call's milliseconds per new token: the call over its new
tokens, so the prompts' prefill is included; the committed output's "ms/step"
is that figure), then a comparison line per program. The committed H200 output,
docs/benchmarks/decode_weights_h200.txt, came from this script's first form,
which also timed the fused form on f32 weights cast at every step (before
`decode.weights_in`) and on weights cast before the call ("fused_castonce",
what "fused" does now inside the call).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from flax import nnx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="configs/tiny_cpu.py, short (smoke)")
    args = ap.parse_args()
    from gdpo_jax.models.sharding import create_model
    from gdpo_jax.sampling import decode
    from gdpo_jax.scale.arch import model_config
    from gdpo_jax.scale.lowering import generate_program
    from gdpo_jax.scale.measure import _generate_inputs
    from gdpo_jax.train import mesh as mesh_lib
    from gdpo_jax.train.config import validated_copy

    if args.tiny:
        from configs import tiny_cpu

        c = tiny_cpu.get_config()
        c.sampling.max_prompt_len, c.sampling.max_new_tokens = 8, 16
    else:
        from configs import paper_math

        c = paper_math.get_config("r1-distill-1.5b")
        c.algo.num_prompts, c.algo.num_minibatches, c.algo.num_microbatches = 4, 1, 4
        c.sampling.max_prompt_len, c.sampling.max_new_tokens = 512, 256
    c.sampling.rows_per_call = 0
    c = validated_copy(c, "/tmp/gdpo_probe")
    mesh = mesh_lib.make_mesh(
        tuple(c.mesh.shape), axis_types=c.mesh.axis_types, devices=jax.devices()[:1]
    )
    mc = model_config(c)
    graphdef, state = nnx.split(create_model(mc, mesh=mesh, seed=0))
    rows = c.algo.num_prompts * c.algo.group_size
    _, arg_sds, _, base_spec, _ = generate_program(c, graphdef, None, mesh, rows)
    inputs = _generate_inputs(c, arg_sds[1:], rows, mc.vocab_size, 0)
    cast = decode.weights_in(state, mc.dtype)
    m = int(c.sampling.max_new_tokens)
    out = {}
    for name, layers, st in (
        ("scan_f32", "scan", state),
        ("scan_castonce", "scan", cast),
        ("fused", "fused", state),
    ):
        spec = decode.DecodeSpec(
            max_new_tokens=m,
            chunks=base_spec.chunks,
            top_k=0,
            use_top_p=False,
            greedy=True,
            pad_id=0,
            layers=layers,
            group=base_spec.group,
        )
        fn = decode.make_generate_fn(graphdef, spec, mesh)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            with jax.set_mesh(mesh):
                r = jax.block_until_ready(fn(st, *inputs))
            times.append(time.perf_counter() - t0)
        out[name] = dict(tokens=np.asarray(r["tokens"]), lp=np.asarray(r["logprobs"]))
        print(
            f"{name} first {times[0]:.1f} s, calls {[round(t, 3) for t in times[1:]]} s, "
            # The whole call over its new tokens: the prompts' prefill is included.
            f"ms per new token (prefill included) {min(times[1:]) / m * 1e3:.2f}",
            flush=True,
        )
    base = out["scan_f32"]
    for k, v in out.items():
        same = bool((v["tokens"] == base["tokens"]).all())
        print(
            f"{k} tokens equal to scan_f32: {same} max |dlogp|: "
            f"{np.abs(v['lp'] - base['lp']).max():.2e}"
        )


if __name__ == "__main__":
    main()
