"""RL iteration benchmark: gdpo_jax vs Hugging Face TRL's GRPOTrainer, same checkpoint.

A ~3M-parameter Llama (hidden 256, 4 layers, 4 heads, 2 KV heads, 512-word
vocabulary), 8 prompts x 8 generations, 64 new tokens, 3 Python rewards,
fp32, one optimizer step per batch, GDPO (TRL: multi_objective_aggregation=
"normalize_then_sum"), beta 0 and 0.04. Steady-state seconds per iteration,
split into sample / reward / step, the tokens generated per second of the whole
iteration (not the sampler's throughput: bench_sampler's), and the step's model
FLOPs utilization against a matmul peak measured in the same run (`matmul_peak`).

Each framework runs ROUNDS times per beta, in alternating order (ours then
TRL, then TRL then ours), and the figures are medians over all rounds'
steady-state iterations: a load that comes and goes on a shared machine then
falls on both sides of a ratio, not on whichever ran during it.

`--model smollm2` runs SmolLM2-135M's architecture instead (random init: 30
layers, hidden 576, 9 heads / 3 KV heads, tied 49,152-word vocabulary), 4
prompts x 4 generations: whether the lead holds at the size the project's
CPU experiments train (not part of run_all: minutes per iteration pair).

    python -m benchmarks.bench_rl [--quick] [--model tiny|smollm2] [--rounds N] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from benchmarks import common

# The workload and TRL's side, re-exported: the profiling scripts and tests read them here.
from benchmarks.rl_setup import (  # noqa: F401
    GENERATIONS,
    HEADS,
    HIDDEN,
    INTER,
    KV_HEADS,
    LAYERS,
    NEW_TOKENS,
    OURS_MICROBATCHES,
    OURS_SCAN_LAYERS,
    OURS_SHARE_PROMPT,
    PROMPT_WORDS,
    PROMPTS,
    REWARDS,
    SHAPES,
    TINY,
    VOCAB,
    Shape,
    make_checkpoint,
    make_tokenizer,
    model_flops,
    prompts,
)
from benchmarks.rl_trl import bench_trl, bench_trl_clean_env, trl_args  # noqa: F401

# Per framework and beta, alternating order (--quick: 1). Five: on the 2-core VMs one
# round's median iteration moved by up to 30 % between rounds of one run (2026-12-05).
ROUNDS = 5
TIMES = ("iter_s", "sample_s", "reward_s", "step_s", "len")  # per-iteration series
# Our trainer's metric for each series.
_OURS_METRICS = {
    "iter_s": "time/iter_s",
    "sample_s": "time/sample_s",
    "reward_s": "time/reward_s",
    "step_s": "time/step_s",
    "len": "len/mean",
}


# (n, calls per timed round) on CPU: one 1024^3 product (2.1 GFLOP) is long against
# a call's dispatch there.
CPU_PEAK = (1024, 1)
# On an accelerator one synchronised 1024^3 product times its launch and the wait,
# not its arithmetic (docs/benchmarks/rl_h200_*.json recorded such latency-bound
# "peaks"): as common.matmul_peak does, a larger product, several calls back to
# back and one wait per round, so the launches overlap the work.
ACCEL_PEAK = (8192, 10)


def peak_shape(accelerator: bool) -> tuple[int, int]:
    """(n, calls per round) of `matmul_peak` on an accelerator or on CPU."""
    return ACCEL_PEAK if accelerator else CPU_PEAK


def matmul_peak(
    framework: str, n: int = 1024, reps: int = 20, device: str = "cpu", calls: int = 1
) -> float:
    """Measured f32 matmul FLOP/s of an n x n x n product: the best of `reps` rounds of
    `calls` products dispatched back to back and waited on once; torch's on `device`
    (JAX's on its default backend)."""
    if framework == "jax":
        import jax
        import jax.numpy as jnp

        a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
        f = jax.jit(lambda x: x @ x)
        f(a).block_until_ready()

        def round_() -> None:
            jax.block_until_ready([f(a) for _ in range(calls)])

        best = min(_timed(round_) for _ in range(reps))
    else:
        import torch

        a = torch.randn(n, n, device=device)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        a @ a
        sync()
        best = min(_timed(lambda: ([a @ a for _ in range(calls)], sync())) for _ in range(reps))
    return 2 * n**3 * calls / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ------------------------------------------------------------------ gdpo_jax
def bench_ours(
    ckpt: str, beta: float, *, warmup: int, iters: int, shape: Shape = TINY
) -> dict[str, Any]:
    """Our trainer's steady-state iterations: {series name (TIMES): [iters floats], "compiles"}."""
    from gdpo_jax.rewards import register_reward
    from gdpo_jax.tasks import TaskData
    from gdpo_jax.train.config import base_config
    from gdpo_jax.train.loop import Trainer

    for fn in REWARDS:
        register_reward(f"bench_{fn.__name__}")(fn)
    c = base_config()
    c.workdir = common.scratch_dir("bench_rl_")
    c.model.name = ckpt
    c.task.name = "toolcall"  # not loaded: the task data is passed in
    c.task.chat_template = False
    c.rewards.names = tuple(f"bench_{fn.__name__}" for fn in REWARDS)
    c.rewards.num_workers = 1
    c.algo.estimator, c.algo.beta, c.algo.kl_estimator = "gdpo", beta, "k3"
    c.algo.group_size, c.algo.num_prompts = shape.generations, shape.prompts
    c.algo.aggregation = "grpo"
    c.algo.num_microbatches = shape.microbatches
    c.model.scan_layers = shape.scan_layers
    c.algo.share_prompt = OURS_SHARE_PROMPT
    c.sampling.max_new_tokens, c.sampling.max_prompt_len = shape.new_tokens, PROMPT_WORDS + 1
    c.optim.lr = 1e-5
    c.mesh.num_devices = 1
    c.train.num_steps = warmup + iters
    c.train.progress_bar = False
    task = TaskData(train=[{"prompt": p} for p in prompts(64, vocab=shape.vocab)], eval=[])
    trainer = Trainer(c, task=task)
    rows = []
    for i in range(warmup + iters):
        m = trainer.train_step(i)
        if i >= warmup:
            rows.append(m)
    trainer.runner.close()
    series: dict[str, Any] = {k: [float(r[m]) for r in rows] for k, m in _OURS_METRICS.items()}
    series["compiles"] = trainer.step.compile_count()
    return series


def summarize(rounds: list[dict[str, Any]], shape: Shape = TINY) -> dict[str, Any]:
    """Medians over every round's iterations (rounds: bench_ours/bench_trl outputs)."""
    pooled = {k: [x for r in rounds for x in r[k]] for k in TIMES}
    med = {k: statistics.median(v) for k, v in pooled.items()}
    return {
        "iter_s": med["iter_s"],
        "sample_s": med["sample_s"],
        "reward_s": med["reward_s"],
        "step_s": med["step_s"],
        # Tokens generated per second of the whole iteration (sampling, rewards and
        # step), the table's "gen tok / iter s"; the key keeps its committed name.
        "gen_tokens_per_s": med["len"] * shape.prompts * shape.generations / med["iter_s"],
        "mean_len": med["len"],
        "seq": PROMPT_WORDS + 1 + shape.new_tokens,
        # per-round medians: the spread a single run would have shown
        "round_iter_s": [statistics.median(r["iter_s"]) for r in rounds],
        "round_step_s": [statistics.median(r["step_s"]) for r in rounds],
        # Other processes' share of the cores' time during each round (None: unknown).
        "round_other_cpu_frac": [r.get("host", {}).get("other_cpu_frac") for r in rounds],
        # The kernel's huge-page fallbacks and compaction stalls during each round (None:
        # unknown): the huge-page malloc tunable's pages not all granted, or waited for.
        "round_huge_page_fallbacks": [r.get("host", {}).get("huge_page_fallbacks") for r in rounds],
        "round_compaction_stalls": [r.get("host", {}).get("compaction_stalls") for r in rounds],
    }


# ------------------------------------------------------------------- driver
def run(quick: bool = False, rounds: int | None = None, model: str = "tiny") -> dict:
    """Both frameworks at beta 0 and 0.04. Returns a JSON-able dict of results.

    rounds: per framework and beta (default ROUNDS; 1 with quick). model: a SHAPES key."""
    shape = SHAPES[model]
    warmup, iters = (1, 1) if quick else (2, 5) if model == "tiny" else (1, 3)
    rounds = rounds or (1 if quick else ROUNDS)
    with tempfile.TemporaryDirectory(prefix="bench_ckpt_") as tmp:
        return _measure(make_checkpoint(tmp, shape), shape, model, warmup, iters, rounds)


def _measure(ckpt: str, shape: Shape, model: str, warmup: int, iters: int, rounds: int) -> dict:
    """`run` on a written checkpoint."""
    import jax

    device = common.torch_device()  # TRL on CUDA where our side runs on a GPU
    n, calls = peak_shape(jax.default_backend() != "cpu")
    peak = {
        "jax": matmul_peak("jax", n, calls=calls),
        "torch": matmul_peak("torch", n, device=device, calls=calls),
    }
    out: dict[str, Any] = {
        "config": dict(
            **({} if model == "tiny" else {"model": model}),
            hidden=shape.hidden,
            layers=shape.layers,
            heads=shape.heads,
            kv_heads=shape.kv_heads,
            intermediate=shape.inter,
            vocab=shape.vocab,
            prompts=shape.prompts,
            generations=shape.generations,
            new_tokens=shape.new_tokens,
            warmup=warmup,
            iters=iters,
            rounds=rounds,
            ours_microbatches=shape.microbatches,
            ours_scan_layers=shape.scan_layers,
            ours_share_prompt=OURS_SHARE_PROMPT,
            # Runs without this field used TRL's default, which recomputed its layers.
            trl_gradient_checkpointing=trl_args(shape, 0.0, 1)["gradient_checkpointing"],
        ),
        "machine": common.machine_info(),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
        "jax_backend": jax.default_backend(),
        "trl_device": device,
        "matmul_precision": str(jax.config.jax_default_matmul_precision or "default"),
        "matmul_peak_gflops": {k: v / 1e9 for k, v in peak.items()},
        "matmul_peak_n": n,
        "matmul_peak_calls": calls,
        "cpu_count": os.cpu_count(),
        "results": {},
    }
    for beta in (0.0, 0.04):
        runs: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
        for i in range(rounds):
            for fw in ("ours", "trl") if i % 2 == 0 else ("trl", "ours"):
                kw = dict(warmup=warmup, iters=iters)
                before = common.host_counters()
                if fw == "ours":
                    runs[fw].append(bench_ours(ckpt, beta, **kw, shape=shape))
                else:
                    runs[fw].append(
                        bench_trl_clean_env(ckpt, beta, **kw, device=device, model=model)
                    )
                runs[fw][-1]["host"] = common.host_activity(before, common.host_counters())
        ours, trl = summarize(runs["ours"], shape), summarize(runs["trl"], shape)
        ours["compiles"] = max(r["compiles"] for r in runs["ours"])
        trl["glibc_tunables"] = ""
        rows = shape.prompts * shape.generations
        for r, fw in ((ours, "jax"), (trl, "torch")):
            flops = model_flops(rows, int(r["seq"]), beta=beta, shape=shape)
            r["step_mfu"] = flops / r["step_s"] / peak[fw] if r["step_s"] > 0 else float("nan")
            r["step_gflops"] = flops / 1e9
        out["results"][f"beta={beta}"] = {
            "gdpo_jax": ours,
            "trl": trl,
            "speedup_iter": trl["iter_s"] / ours["iter_s"],
            "speedup_step": trl["step_s"] / ours["step_s"],
            "speedup_sample": trl["sample_s"] / ours["sample_s"],
            # Each round's TRL / ours iteration ratio: the two ran back to back, so a
            # slow spell of the machine falls on both sides of a round's ratio.
            "round_speedup_iter": [
                t / o for o, t in zip(ours["round_iter_s"], trl["round_iter_s"], strict=True)
            ],
        }
    return out


def table(res: dict) -> str:
    lines = [
        "| beta | framework | iter s | sample s | reward s | step s | gen tok / iter s "
        "| step MFU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, r in res["results"].items():
        for fw in ("gdpo_jax", "trl"):
            x = r[fw]
            lines.append(
                f"| {key[5:]} | {fw} | {x['iter_s']:.3f} | {x['sample_s']:.3f} | "
                f"{x['reward_s']:.4f} | {x['step_s']:.3f} | {x['gen_tokens_per_s']:.0f} | "
                f"{100 * x['step_mfu']:.1f}% |"
            )
        lines.append(
            f"| {key[5:]} | TRL / gdpo_jax | {r['speedup_iter']:.1f}x | "
            f"{r['speedup_sample']:.1f}x | | {r['speedup_step']:.1f}x | | |"
        )
    rounds = [
        f"beta {key[5:]}: gdpo_jax {', '.join(f'{t:.3f}' for t in r['gdpo_jax']['round_iter_s'])}"
        f"; trl {', '.join(f'{t:.3f}' for t in r['trl']['round_iter_s'])}"
        for key, r in res["results"].items()
        if "round_iter_s" in r["gdpo_jax"]
    ]
    if rounds:
        head = "\neach round's median iteration s (the spread one run would show): "
        lines.append(head + "; ".join(rounds))
    paired = [
        f"beta {key[5:]}: {', '.join(f'{x:.2f}x' for x in r['round_speedup_iter'])}"
        for key, r in res["results"].items()
        if "round_speedup_iter" in r
    ]
    if paired:
        lines.append("each round's TRL / gdpo_jax iteration ratio: " + "; ".join(paired))
    loaded = [
        f"beta {key[5:]} {fw} round {i + 1}: {x:.0%}"
        for key, r in res["results"].items()
        for fw in ("gdpo_jax", "trl")
        for i, x in enumerate(r[fw].get("round_other_cpu_frac", []))
        if x is not None and x > common.LOADED_FRAC
    ]
    if loaded:
        lines.append(
            "rounds beside other work (other processes' share of the cores): " + "; ".join(loaded)
        )
    small_pages = [
        f"beta {key[5:]} {fw} round {i + 1}: {f or 0} fallbacks, {c or 0} stalls"
        for key, r in res["results"].items()
        for fw in ("gdpo_jax", "trl")
        for i, (f, c) in enumerate(
            zip(
                r[fw].get("round_huge_page_fallbacks", []),
                r[fw].get("round_compaction_stalls", []),
                strict=True,
            )
        )
        if (f or 0) + (c or 0) > 0
    ]
    if small_pages:
        lines.append(
            "rounds whose huge pages fell back to small ones or waited for compaction: "
            + "; ".join(small_pages)
        )
    peak = res["matmul_peak_gflops"]
    # Runs before matmul_peak_n was recorded timed one 1024^3 product per round.
    n, calls = res.get("matmul_peak_n", 1024), res.get("matmul_peak_calls", 1)
    back_to_back = f", {calls} calls back to back" if calls > 1 else ""
    lines.append(
        f"\nmatmul peak (f32, {n}^3{back_to_back}): jax {peak['jax']:.1f} GFLOP/s, "
        f"torch {peak['torch']:.1f} GFLOP/s"
    )
    if res.get("trl_device", "cpu") != "cpu":
        lines.append(
            f"jax on {res['jax_backend']} (f32 matmul precision {res['matmul_precision']}), "
            f"TRL on {res['trl_device']}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="")
    ap.add_argument("--rounds", type=int, default=0, help=f"Rounds (default {ROUNDS}).")
    ap.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    a = ap.parse_args()
    if a.out:
        common.check_out(ap, a.out, "--out", is_dir=False)  # before the run
    res = run(a.quick, rounds=a.rounds or None, model=a.model)
    print(table(res))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
