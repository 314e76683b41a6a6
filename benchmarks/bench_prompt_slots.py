"""Benchmark: continuous batching with shared prompt slots vs a prompt copy per lane.

With long prompts and G rows per prompt, continuous batching's lanes each hold
and read a copy of their prompt's KV slots; with ``continuous_prompt_slots`` W
they read W shared prompt slots instead (`gdpo_jax/sampling/continuous.py`,
"Shared prompt slots"). This runs the real Sampler (tiny random Llama of
bench_sampler, greedy, EOS off) on bench_longtail's long-tailed lengths
(each row ended at its drawn length by max_new_tokens_per_row) with
`--prompt-len` token prompts of `--group` rows each, for W = 0 (copies) and
the given W values, interleaved (best of repeats), and reports per W: decode
steps, KV slots read (`bench_longtail.kv_slot_reads`'s count for that W),
seconds, useful tokens/s and whether the greedy rows equal the copies'. A
call with every row's budget at 1 token times the fixed part (the prompts'
prefill and the refills), reported beside.

  python -m benchmarks.bench_prompt_slots [--full] [--prompt-len 2048] [--group 8] \
      [--prompt-slots 4 6 8] [--out runs/bench/prompt_slots.json]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import numpy as np

from benchmarks import common
from benchmarks.bench_longtail import SIZES, kv_slot_reads, longtail_lengths

DEFAULT_OUT = "runs/bench/prompt_slots.json"


def run(
    quick: bool = True,
    *,
    prompt_len: int = 2048,
    group: int = 8,
    prompt_slots: tuple[int, ...] = (4, 6, 8),
    repeats: int = 2,
    size: tuple[int, int] | None = None,
) -> dict:
    """Interleaved Sampler runs for W = 0 and each of `prompt_slots`; `size`:
    (lanes, cap) instead of bench_longtail's quick / full size (tests)."""
    from benchmarks.bench_sampler import HF_CONFIG, _write_checkpoint
    from gdpo_jax.models import load_pretrained
    from gdpo_jax.sampling import Sampler, SamplingParams

    lanes, cap = size or SIZES["quick" if quick else "full"]
    rows = 8 * lanes
    lengths = longtail_lengths(rows, median=24.0, sigma=1.0, cap=cap)
    with tempfile.TemporaryDirectory() as tmp:
        _write_checkpoint(tmp)
        model, _ = load_pretrained(tmp)
    r = np.random.default_rng(0)
    prompts = [
        list(r.integers(6, HF_CONFIG["vocab_size"], prompt_len)) for _ in range(rows // group)
    ]
    params = SamplingParams(max_new_tokens=cap, greedy=True)
    ws = (0, *prompt_slots)
    samplers = {
        w: Sampler(model, None, eos_token_ids=(), continuous_slots=lanes, continuous_prompt_slots=w)
        for w in ws
    }

    def call(w: int, budgets: np.ndarray):
        return samplers[w].generate(
            prompts,
            params,
            num_generations=group,
            key=jax.random.key(0),
            max_new_tokens_per_row=budgets,
        )

    ones = np.ones_like(lengths)
    first, out = {}, {}
    for w in ws:  # compile (and the fixed-part shape once, with copies)
        t0 = time.perf_counter()
        out[w] = call(w, lengths)
        first[w] = round(time.perf_counter() - t0, 2)
    call(0, ones)
    best = {w: float("inf") for w in ws}
    fixed = float("inf")
    for _ in range(repeats):  # interleaved: every W sees the same machine load
        for w in ws:
            t0 = time.perf_counter()
            call(w, lengths)
            best[w] = min(best[w], time.perf_counter() - t0)
        t0 = time.perf_counter()
        call(0, ones)
        fixed = min(fixed, time.perf_counter() - t0)
    useful = int(lengths.sum())
    per_w = []
    for w in ws:
        reads = kv_slot_reads(
            lengths, lanes, prompt_len, cap, group=group, prompt_slots_per_shard=w
        )
        per_w.append(
            {
                "prompt_slots": w,
                "decode_steps": int(out[w].info["decode_steps"]),
                "kv_slot_reads": reads["continuous_shared" if w else "continuous"],
                "best_s": round(best[w], 3),
                "first_call_s": first[w],
                "useful_tokens_per_s": round(useful / best[w], 1),
                "greedy_rows_identical": bool(
                    np.array_equal(out[w].completion_ids, out[0].completion_ids)
                ),
            }
        )
    return {
        "benchmark": "prompt_slots",
        "quick": quick,
        "machine": common.machine_info(),
        "lanes": lanes,
        "rows": rows,
        "cap": cap,
        "prompt_len": prompt_len,
        "group": group,
        "useful_tokens": useful,
        "fixed_s": round(fixed, 3),
        "runs": per_w,
    }


def table_markdown(result: dict) -> str:
    """One row per W (0: a prompt copy per lane), ratios against the copies."""
    base = result["runs"][0]
    rows = [
        {
            "prompt slots W": str(r["prompt_slots"]) if r["prompt_slots"] else "0 (copies)",
            "decode steps": str(r["decode_steps"]),
            "KV slots read (counts)": f"{r['kv_slot_reads']:,}",
            "seconds": f"{r['best_s']:.2f}",
            "useful tok/s": f"{r['useful_tokens_per_s']:.0f}",
            "vs copies": f"{base['best_s'] / r['best_s']:.2f}x",
            "greedy rows identical": "yes" if r["greedy_rows_identical"] else "NO",
        }
        for r in result["runs"]
    ]
    m = result["machine"]
    return common.markdown_table(rows) + (
        f"\n\n{result['rows']} rows x {result['lanes']} lanes, cap {result['cap']}, "
        f"{result['prompt_len']}-token prompts x {result['group']} rows; every row's budget at 1 "
        f"token (prefill and refills only): {result['fixed_s']:.2f} s. {common.cpu_label(m)}; "
        "best of the interleaved repeats."
    )


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`parser.error` (one line, exit 2) for counts `run` cannot use and an --out
    that cannot be written."""
    lanes, _ = SIZES["full" if args.full else "quick"]
    rows = 8 * lanes
    for flag, value in (("--prompt-len", args.prompt_len), ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{flag}={value} must be >= 1.")
    if args.group < 1:
        parser.error(f"--group={args.group} must be >= 1 (rows per prompt).")
    if rows % args.group:
        parser.error(f"--group={args.group} must divide the {rows} rows (8 x {lanes} lanes).")
    bad = [w for w in args.prompt_slots if w < 1]
    if bad:
        parser.error(
            f"--prompt-slots {' '.join(map(str, bad))}: each W must be >= 1 (W = 0, a prompt "
            "copy per lane, always runs as the baseline)."
        )
    common.check_out(parser, args.out, "--out", is_dir=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON output path.")
    parser.add_argument("--full", action="store_true", help="bench_longtail's full size.")
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-slots", type=int, nargs="+", default=[4, 6, 8])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    check_args(parser, args)  # before the model is built
    result = run(
        quick=not args.full,
        prompt_len=args.prompt_len,
        group=args.group,
        prompt_slots=tuple(args.prompt_slots),
        repeats=args.repeats,
    )
    print(table_markdown(result))
    print(f"wrote {common.write_json(args.out, result)}")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
