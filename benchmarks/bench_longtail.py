"""Benchmark: decode waste under a long-tailed completion length distribution.

Real math rollouts are mostly short with a few rows at the cap. The sampler
decodes every row of a call until the call's longest row ends (static
batch), so the useful share of decoded tokens is sum(len) / (rows x max len
of the call). This benchmark draws completion lengths from a log-normal
(median `--median`, log-std `--sigma`, capped at max_new_tokens), and reports

  * counts (robust on a shared machine): useful tokens, decoded tokens of the
    static batch, and of continuous batching with the same number of slots
    (a slot that finishes takes the next waiting row: decode steps = the
    makespan of the greedy slot schedule), and the useful fraction of each;
  * seconds: one decode step of the batch is timed on the real Sampler (tiny
    random Llama of bench_sampler, EOS off, every row runs max_new_tokens;
    best of interleaved repeats), and useful tokens/s = useful / (steps x
    step seconds). For continuous batching this is a projection from the
    measured step time (refill cost not included: the prompt caches are
    prefilled once per call already; a refill copies one prompt's cache row).

  python -m benchmarks.bench_longtail [--quick] [--out runs/bench/longtail.json]
"""

from __future__ import annotations

import argparse
import heapq
import tempfile
import time

import jax
import numpy as np

from benchmarks import common

DEFAULT_OUT = "runs/bench/longtail.json"


def longtail_lengths(n: int, *, median: float, sigma: float, cap: int, seed: int = 0) -> np.ndarray:
    """i32[n] completion lengths: log-normal(log median, sigma), clipped to [1, cap]."""
    r = np.random.default_rng(seed)
    return np.clip(np.round(r.lognormal(np.log(median), sigma, n)), 1, cap).astype(np.int32)


def static_decode_steps(lengths: np.ndarray, rows_per_call: int) -> int:
    """Decode steps of consecutive static calls: each runs to its longest row."""
    return int(
        sum(lengths[i : i + rows_per_call].max() for i in range(0, len(lengths), rows_per_call))
    )


def continuous_decode_steps(lengths: np.ndarray, slots: int) -> int:
    """Steps until every row is done when `slots` rows decode at once and a
    finished slot takes the next waiting row (in order) at the next step."""
    free = [0] * min(slots, len(lengths))  # step at which each slot is free
    heapq.heapify(free)
    end = 0
    for n in lengths:
        start = heapq.heappop(free)
        heapq.heappush(free, start + int(n))
        end = max(end, start + int(n))
    return end


def waste_table(lengths: np.ndarray, slots: int) -> dict[str, float]:
    """Counts of useful vs decoded row-steps for static and continuous batching."""
    useful = int(lengths.sum())
    s_steps = static_decode_steps(lengths, slots)
    c_steps = continuous_decode_steps(lengths, slots)
    return {
        "rows": int(len(lengths)),
        "slots": int(slots),
        "useful_tokens": useful,
        "static_steps": s_steps,
        "static_decoded_tokens": s_steps * slots,
        "static_useful_frac": round(useful / (s_steps * slots), 4),
        "continuous_steps": c_steps,
        "continuous_decoded_tokens": c_steps * slots,
        "continuous_useful_frac": round(useful / (c_steps * slots), 4),
        "useful_throughput_gain": round(s_steps / c_steps, 2),
    }


def _step_seconds(slots: int, max_new: int, repeats: int) -> tuple[float, float]:
    """(seconds per decode step of `slots` rows, compile seconds) on the real Sampler."""
    from benchmarks.bench_sampler import HF_CONFIG, PROMPT_LEN, _write_checkpoint
    from gdpo_jax.models import load_pretrained
    from gdpo_jax.sampling import Sampler, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        _write_checkpoint(tmp)
        model, _ = load_pretrained(tmp)
    sampler = Sampler(model, None, eos_token_ids=())
    prompts = np.random.default_rng(0).integers(6, HF_CONFIG["vocab_size"], (slots, PROMPT_LEN))
    params = SamplingParams(max_new_tokens=max_new, greedy=True)
    t0 = time.perf_counter()
    sampler.generate([list(p) for p in prompts], params, key=jax.random.key(0))
    compile_s = time.perf_counter() - t0
    best = float("inf")
    for i in range(repeats):
        t0 = time.perf_counter()
        ro = sampler.generate([list(p) for p in prompts], params, key=jax.random.key(i))
        best = min(best, time.perf_counter() - t0)
        assert int(ro.info["decode_steps"]) == max_new
    return best / max_new, compile_s


def run(quick: bool = False, *, median: float = 24.0, sigma: float = 1.0) -> dict:
    slots = 32 if quick else 64
    max_new = 128 if quick else 512
    rows = slots * 8
    lengths = longtail_lengths(rows, median=median, sigma=sigma, cap=max_new)
    counts = waste_table(lengths, slots)
    step_s, compile_s = _step_seconds(slots, max_new, repeats=2 if quick else 3)
    useful = counts["useful_tokens"]
    timing = {
        "step_s": round(step_s, 6),
        "compile_s": round(compile_s, 2),
        "static_decoded_tokens_per_s": round(slots / step_s, 1),
        "static_useful_tokens_per_s": round(useful / (counts["static_steps"] * step_s), 1),
        "continuous_useful_tokens_per_s_projected": round(
            useful / (counts["continuous_steps"] * step_s), 1
        ),
    }
    return {
        "benchmark": "longtail",
        "quick": quick,
        "machine": common.machine_info(),
        "lengths": {
            "median": median,
            "sigma": sigma,
            "cap": max_new,
            "mean": round(float(lengths.mean()), 1),
            "p90": int(np.percentile(lengths, 90)),
            "at_cap_frac": round(float((lengths == max_new).mean()), 4),
        },
        "counts": counts,
        "timing": timing,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON output path.")
    parser.add_argument("--quick", action="store_true", help="Smaller batch and cap.")
    parser.add_argument("--median", type=float, default=24.0)
    parser.add_argument("--sigma", type=float, default=1.0)
    args = parser.parse_args()
    result = run(quick=args.quick, median=args.median, sigma=args.sigma)
    for k in ("lengths", "counts", "timing"):
        print(k, result[k])
    print(f"wrote {common.write_json(args.out, result)}")


if __name__ == "__main__":
    main()
