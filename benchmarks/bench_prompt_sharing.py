"""Benchmark: the fused step and the log-prob pass with each prompt run once per
micro-batch (`algo.share_prompt`) against once per completion, by prompt width.

bench_rl's model and batch (hidden 256, 4 layers unrolled, vocab 512; 8 prompts
x G = 8, 64 new tokens, 4 micro-batches of 2 groups, beta 0.04) at prompt widths
P = 16, 64, 256 (each prompt left padded to P from a random length in [P/2, P]).
Both sides run the same `CompiledStep` from the same initial params, alternated
round by round; "ideal" is the token-count ratio (P + C) / (P / G + C). The
log-prob pass is the reference (or old-policy) forward; the step is fwd + bwd.

`--model smollm2` is the accelerator run: SmolLM2-135M's architecture (random
init, f32 params, bf16 compute, layer scan; 8 prompts x G = 8, 256 new tokens, 8
micro-batches of one group; matrices drawn so that attention and logits are far from
uniform) at the paper's prompt widths 512 and 2048, once per attention
kernel the backend offers (GPU: the einsum path "xla" and cuDNN flash attention
"cudnn"; TPU: "xla" and "splash"; CPU: "xla" and "dpa"), each side's log-probs
also against the per-row einsum path in f32 with full-precision matmuls (the
reference). With --quick it runs the tiny model that way.

  python -m benchmarks.bench_prompt_sharing [--quick] [--model tiny|smollm2]
      [--attention xla,cudnn] [--microbatches N] [--widths 512,2048]
      [--out runs/bench/prompt_sharing.json]
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

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
# The accelerator run (--model smollm2): "model" names benchmarks.bench_model's config.
SMOLLM2 = {
    "model": "smollm2-135m",
    "prompts": 8,
    "group": 8,
    "new_tokens": 256,
    "microbatches": 8,
    "widths": (512, 2048),
    "rounds": 5,
}
KERNELS = {"gpu": ("xla", "cudnn"), "tpu": ("xla", "splash"), "cpu": ("xla", "dpa")}


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


def _sharp_model(cfg: ModelConfig, seed: int = 0) -> nnx.Module:
    """The model with every matrix drawn N(0, (1.5 / sqrt(hidden))^2) from NumPy and
    the norms at one: attention scores and logits of order one, where the default
    init's are near uniform, so a kernel that reads the wrong keys moves the
    log-probs far more than bf16 rounding does."""
    model = create_model(cfg, seed=0)
    rs, std = np.random.RandomState(seed), 1.5 / np.sqrt(cfg.hidden_size)
    flat = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        v = var.get_value()
        if v.ndim >= 2:
            v = jnp.asarray(std * rs.randn(*v.shape), v.dtype)  # unsharded, as create_model's
        flat.append((path, var.replace(v)))
    nnx.update(model, nnx.from_flat_state(flat))
    return model


def _side(
    s: dict, sc: StepConfig, model_cfg: ModelConfig, sharp: bool = False
) -> tuple[CompiledStep, list]:
    tx = optax.adamw(1e-5)
    model = _sharp_model(model_cfg) if sharp else create_model(model_cfg, seed=0)
    graphdef, state = state_lib.create_train_state(model, tx, None)
    step = CompiledStep(graphdef=graphdef, tx=tx, schedule=optax.constant_schedule(1e-5), cfg=sc)
    return step, [state]


def _model_cfg(s: dict) -> ModelConfig:
    """The f32 einsum-path model of shape `s` (its vocabulary is s["vocab"]); the
    einsum path named, so that "auto" does not pick splash on a TPU."""
    if s["model"] == "smollm2-135m":
        from benchmarks.bench_model import SMOLLM2_135M

        return SMOLLM2_135M.replace(attention="xla")
    kv_heads = s["model"]["num_heads"] // 2
    return ModelConfig.tiny(
        vocab_size=s["vocab"],
        num_kv_heads=kv_heads,
        scan_layers=False,
        attention="xla",
        **s["model"],
    )


def _max_diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b)[mask].max())


def run(
    quick: bool = False,
    model: str = "tiny",
    attention: tuple[str, ...] | None = None,
    microbatches: int | None = None,
    widths: tuple[int, ...] | None = None,
) -> dict:
    """Times both sides at every width (and, with model="smollm2", every attention
    kernel of the backend in bf16, or those of `attention`); returns a JSON-able
    dict (run_all uses it). microbatches / widths override the shape's."""
    kernels_run = model == "smollm2"
    s = dict(QUICK if quick else SMOLLM2 if kernels_run else FULL)
    s.update({k: v for k, v in (("microbatches", microbatches), ("widths", widths)) if v})
    base = _model_cfg(s)
    s["vocab"] = base.vocab_size
    backend = jax.default_backend()
    kinds = KERNELS.get(backend, ("xla",)) if kernels_run else ("xla",)
    if attention:
        if not kernels_run or set(attention) - set(kinds):
            raise ValueError(
                f"--attention {','.join(attention)}: this backend ({backend}) offers "
                f"{','.join(kinds)} with --model smollm2; pick among those."
            )
        kinds = attention
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
        mask = np.asarray(batch["completion_mask"]) > 0
        reference = None
        if kernels_run:  # per-row einsum path, f32, full-precision matmuls
            ref_step, ref_box = _side(s, plain, base, sharp=True)
            with jax.default_matmul_precision("highest"):
                reference = np.asarray(ref_step.logprobs(ref_box[0].params, batch), np.float64)
            del ref_step, ref_box
        for kind in kinds:
            cfg = base.replace(dtype="bfloat16", attention=kind) if kernels_run else base
            (a, sa), (b, sb) = (_side(s, c, cfg, sharp=kernels_run) for c in (plain, shared))
            ref = jax.tree.map(jnp.copy, sa[0].params)  # the steps donate their states
            lp = [np.asarray(a.logprobs(ref, batch)), np.asarray(b.logprobs(ref, batch))]
            losses = []
            for step, box in ((a, sa), (b, sb)):  # compiles; the first update's loss
                box[0], m = step(box[0], batch)
                losses.append(float(m["loss"]))

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
            row = {
                "prompt_width": P,
                "prompt_tokens_mean": float(np.asarray(batch["prompt_mask"]).sum(1).mean()),
                "new_tokens": C,
                "attention": kind,
                "dtype": cfg.dtype,
                "ideal_speedup": round((P + C) / (P / G + C), 3),
                "step_s_per_row": t[0]["median_s"],
                "step_s_shared": t[1]["median_s"],
                "step_speedup": round(t[0]["median_s"] / t[1]["median_s"], 3),
                "logprob_s_per_row": t[2]["median_s"],
                "logprob_s_shared": t[3]["median_s"],
                "logprob_speedup": round(t[2]["median_s"] / t[3]["median_s"], 3),
                "max_abs_logp_diff": _max_diff(lp[0], lp[1], mask),
                "loss_per_row": losses[0],
                "loss_shared": losses[1],
                "compiles": [a.compile_count(), b.compile_count()],
            }
            if reference is not None:
                row["max_dlogp_vs_f32_per_row"] = _max_diff(lp[0], reference, mask)
                row["max_dlogp_vs_f32_shared"] = _max_diff(lp[1], reference, mask)
                row["logp_std_f32"] = float(reference[mask].std())  # the signal
            rows.append(row)
            del a, b, sa, sb, ref
    return {
        "benchmark": "prompt_sharing",
        "quick": quick,
        "model": model,
        "command": common.command_line(),
        "date": common.now_iso(),
        "machine": common.machine_info(),
        "config": {k: v for k, v in s.items() if k != "widths"},
        "rows": s["prompts"] * s["group"],
        "backend": backend,
        "timing": f"median of {s['rounds']} alternating rounds",
        "results": rows,
    }


def format_table(result: dict) -> str:
    head = (
        f"prompt sharing: {result['rows']} rows, {result['config']['group']} per prompt, "
        f"{result['config']['new_tokens']} new tokens, {result['config']['microbatches']} "
        f"micro-batches, {result['backend']}, {result['timing']}; "
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
    if result.get("model") == "smollm2":
        cols[1:1] = ["attention"]
        cols += ["max_dlogp_vs_f32_per_row", "max_dlogp_vs_f32_shared", "loss_per_row"]
        cols += ["loss_shared"]
    return head + "\n" + common.text_table(result["results"], cols)


def table_markdown(result: dict) -> str:
    """The docs' table (docs/benchmarks.md renders the committed runs with it)."""
    if result.get("model") == "smollm2":
        return kernels_markdown([result])
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


def kernels_markdown(results: list[dict]) -> str:
    """The accelerator runs' table: one line per run, width and kernel; errors
    against the f32 reference."""
    lines = [
        "| prompt width (mean tokens) | attention | micro-batches | ideal | step s, per row "
        "| step s, shared | speed-up | log-prob s, per row | log-prob s, shared | speed-up "
        "| max dlogp vs f32, per row | max dlogp vs f32, shared | loss per row / shared |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for r in res["results"]:
            lines.append(
                f"| {r['prompt_width']} ({r['prompt_tokens_mean']:.0f}) | {r['attention']} "
                f"| {res['config']['microbatches']} | {r['ideal_speedup']:.2f}x "
                f"| {r['step_s_per_row']:.3f} | {r['step_s_shared']:.3f} "
                f"| {r['step_speedup']:.2f}x | {r['logprob_s_per_row']:.4f} "
                f"| {r['logprob_s_shared']:.4f} | {r['logprob_speedup']:.2f}x "
                f"| {r['max_dlogp_vs_f32_per_row']:.3f} | {r['max_dlogp_vs_f32_shared']:.3f} "
                f"| {r['loss_per_row']:.4g} / {r['loss_shared']:.4g} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="JSON output path.")
    ap.add_argument("--quick", action="store_true", help="Tiny model, two widths.")
    ap.add_argument(
        "--model",
        choices=("tiny", "smollm2"),
        default="tiny",
        help="smollm2: SmolLM2-135M's shapes in bf16, every attention kernel of the backend.",
    )
    ap.add_argument("--attention", help="Comma-separated kernels (default: the backend's).")
    ap.add_argument("--microbatches", type=int, help="Override the shape's micro-batch count.")
    ap.add_argument("--widths", help="Comma-separated prompt widths (default: the shape's).")
    a = ap.parse_args()
    common.check_out(ap, a.out, "--out", is_dir=False)  # before the run

    def split(text: str | None, cast: type) -> tuple | None:
        return tuple(cast(x) for x in text.split(",")) if text else None

    result = run(
        quick=a.quick,
        model=a.model,
        attention=split(a.attention, str),
        microbatches=a.microbatches,
        widths=split(a.widths, int),
    )
    print(format_table(result))
    print(f"wrote {common.write_json(a.out, result)}")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
