"""Benchmark: the fused step and the log-prob pass with each prompt run once per
micro-batch (`algo.share_prompt`) against once per completion, by prompt width.

bench_rl's model and batch (hidden 256, 4 layers unrolled, vocab 512; 8 prompts
x G = 8, 64 new tokens, 4 micro-batches of 2 groups, beta 0.04) at prompt widths
P = 16, 64, 256 (each prompt left padded to P from a random length in [P/2, P]).
Both sides run the same `CompiledStep` from the same initial params, alternated
round by round; "ideal" is the token-count ratio (P + C) / (P / G + C). The
log-prob pass is the reference (or old-policy) forward; the step is fwd + bwd.

  python -m benchmarks.bench_prompt_sharing [--quick] [--out runs/bench/prompt_sharing.json]
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import common
from gdpo_jax.models import ModelConfig
from gdpo_jax.models.sharding import create_model
from gdpo_jax.train import distributed
from gdpo_jax.train import state as state_lib
from gdpo_jax.train.step import CompiledStep, StepConfig

DEFAULT_OUT = "runs/bench/prompt_sharing.json"
FULL = {
    "model": dict(hidden_size=256, intermediate_size=640, num_layers=4, num_heads=4, head_dim=64),
    "vocab": 512,
    "prompts": 8,
    "group": 8,
    "new_tokens": 64,
    "microbatches": 4,
    "widths": (16, 64, 256),
    "rounds": 7,
}
QUICK = {
    "model": dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, head_dim=16),
    "vocab": 64,
    "prompts": 2,
    "group": 4,
    "new_tokens": 8,
    "microbatches": 2,
    "widths": (8, 32),
    "rounds": 2,
}


def make_batch(s: dict, width: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rollout-shaped host batch: prompt-major groups sharing one left-padded prompt."""
    r = np.random.default_rng(seed)
    n, g, c, v = s["prompts"] * s["group"], s["group"], s["new_tokens"], s["vocab"]
    plen = r.integers(width // 2, width + 1, s["prompts"])
    pmask = (np.arange(width)[None] >= width - plen[:, None]).astype(np.int32)
    pids = np.where(pmask, r.integers(3, v, (s["prompts"], width)), 0).astype(np.int32)
    clen = r.integers(c // 2, c + 1, n)
    cmask = (np.arange(c)[None] < clen[:, None]).astype(np.int32)
    return {
        "prompt_ids": np.repeat(pids, g, 0),
        "prompt_mask": np.repeat(pmask, g, 0),
        "completion_ids": np.where(cmask, r.integers(3, v, (n, c)), 0).astype(np.int32),
        "completion_mask": cmask,
        "ref_logp": np.full((n, c), -np.log(v), np.float32),
        "rewards": r.integers(0, 2, (n, 2)).astype(np.float32),
        "group_ids": np.repeat(np.arange(s["prompts"]), g).astype(np.int32),
        "valid": np.ones(n, bool),
    }


def _side(s: dict, sc: StepConfig, model_cfg: ModelConfig) -> tuple[CompiledStep, list]:
    tx = optax.adamw(1e-5)
    graphdef, state = state_lib.create_train_state(create_model(model_cfg, seed=0), tx, None)
    step = CompiledStep(graphdef=graphdef, tx=tx, schedule=optax.constant_schedule(1e-5), cfg=sc)
    return step, [state]


def run(quick: bool = False) -> dict:
    """Times both sides at every width; returns a JSON-able dict (run_all uses it)."""
    s = QUICK if quick else FULL
    kv_heads = s["model"]["num_heads"] // 2
    model_cfg = ModelConfig.tiny(
        vocab_size=s["vocab"], num_kv_heads=kv_heads, scan_layers=False, **s["model"]
    )
    plain = StepConfig(
        num_groups=s["prompts"],
        beta=0.04,
        num_microbatches=s["microbatches"],
        old_logp_in_step=True,
        group_size=s["group"],
    )
    shared = dataclasses.replace(plain, share_prompt=True)
    rows = []
    for width in s["widths"]:
        batch = distributed.to_global(make_batch(s, width), None)
        (a, sa), (b, sb) = _side(s, plain, model_cfg), _side(s, shared, model_cfg)
        ref = jax.tree.map(jnp.copy, sa[0].params)  # the steps donate their states
        lp = [np.asarray(a.logprobs(ref, batch)), np.asarray(b.logprobs(ref, batch))]
        mask = np.asarray(batch["completion_mask"]) > 0

        def stepper(step: CompiledStep, box: list, batch: dict = batch):
            def go():
                box[0], m = step(box[0], batch)
                jax.block_until_ready(m)

            return go

        def logprobs(step: CompiledStep, ref: Any = ref, batch: dict = batch):
            return lambda: jax.block_until_ready(step.logprobs(ref, batch))

        t = common.time_interleaved(
            [stepper(a, sa), stepper(b, sb), logprobs(a), logprobs(b)],
            repeats=s["rounds"],
            warmup=1,
        )
        P, C, G = width, s["new_tokens"], s["group"]
        rows.append(
            {
                "prompt_width": P,
                "prompt_tokens_mean": float(np.asarray(batch["prompt_mask"]).sum(1).mean()),
                "new_tokens": C,
                "ideal_speedup": round((P + C) / (P / G + C), 3),
                "step_s_per_row": t[0]["median_s"],
                "step_s_shared": t[1]["median_s"],
                "step_speedup": round(t[0]["median_s"] / t[1]["median_s"], 3),
                "logprob_s_per_row": t[2]["median_s"],
                "logprob_s_shared": t[3]["median_s"],
                "logprob_speedup": round(t[2]["median_s"] / t[3]["median_s"], 3),
                "max_abs_logp_diff": float(np.abs(lp[0] - lp[1])[mask].max()),
                "compiles": [a.compile_count(), b.compile_count()],
            }
        )
    return {
        "benchmark": "prompt_sharing",
        "quick": quick,
        "command": common.command_line(),
        "date": common.now_iso(),
        "machine": common.machine_info(),
        "config": {k: v for k, v in s.items() if k != "widths"},
        "rows": s["prompts"] * s["group"],
        "backend": jax.default_backend(),
        "timing": f"median of {s['rounds']} alternating rounds",
        "results": rows,
    }


def format_table(result: dict) -> str:
    head = (
        f"prompt sharing: {result['rows']} rows, {result['config']['group']} per prompt, "
        f"{result['config']['new_tokens']} new tokens, {result['backend']}, {result['timing']}; "
        f"{common.describe_machine(result['machine'])}"
    )
    cols = [
        "prompt_width",
        "ideal_speedup",
        "step_s_per_row",
        "step_s_shared",
        "step_speedup",
        "logprob_s_per_row",
        "logprob_s_shared",
        "logprob_speedup",
        "max_abs_logp_diff",
    ]
    return head + "\n" + common.text_table(result["results"], cols)


def table_markdown(result: dict) -> str:
    """The docs' table (docs/benchmarks.md renders the committed run with it)."""
    lines = [
        "| prompt width (mean tokens) | ideal | step s, per row | step s, shared | speed-up "
        "| log-prob s, per row | log-prob s, shared | speed-up | max abs logp diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        lines.append(
            f"| {r['prompt_width']} ({r['prompt_tokens_mean']:.0f}) | {r['ideal_speedup']:.2f}x "
            f"| {r['step_s_per_row']:.3f} | {r['step_s_shared']:.3f} | {r['step_speedup']:.2f}x "
            f"| {r['logprob_s_per_row']:.3f} | {r['logprob_s_shared']:.3f} "
            f"| {r['logprob_speedup']:.2f}x | {r['max_abs_logp_diff']:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    common.quick_out_main(__doc__, run, format_table, DEFAULT_OUT, "Tiny model, two widths.")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
