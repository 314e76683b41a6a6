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
  * seconds, measured (greedy, interleaved, best of repeats) on the real
    Sampler with each row ended at its drawn length (max_new_tokens_per_row):
    static calls of `slots` rows (rows_per_call = slots) vs one continuous-
    batching call with `slots` lanes (Sampler(continuous_slots=slots)), with
    useful tokens/s (sum of lengths / s) and decoded tokens/s (row-steps / s),
    and whether the greedy rows are identical.

  python -m benchmarks.bench_longtail [--quick] [--out runs/bench/longtail.json]
"""

from __future__ import annotations

import argparse
import heapq
import tempfile
import time
from collections.abc import Iterator

import jax
import numpy as np

from benchmarks import common
from benchmarks.bench_sampler import PROMPT_LEN

DEFAULT_OUT = "runs/bench/longtail.json"
SIZES = {"quick": (16, 128), "full": (64, 512)}  # slots, cap; rows = 8 x slots


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


def lane_schedule(
    lengths: np.ndarray, lanes: int, group: int = 1, prompt_slots: int = 0
) -> Iterator[dict[int, tuple[int, int]]]:
    """Continuous batching's schedule: each step's live lanes {lane: (row, the
    row's step t)}. Free lanes take waiting rows in row order (`continuous.py`);
    with `prompt_slots` W > 0 (shared prompts, rows prompt-major, `group` per
    prompt) a row starts only if its prompt holds a slot or a slot is free (no
    live lane and no waiting row): the rows that start are a prefix of the
    waiting ones."""
    lane_row: dict[int, int] = {}
    lane_t: dict[int, int] = {}
    lane_slot: dict[int, int] = {}
    slot_u, u_open, open_slot, nxt, n = [-1] * prompt_slots, -1, 0, 0, len(lengths)
    while True:
        if prompt_slots:
            users = {lane_slot[b] for b in lane_row}
            u_next = nxt // group if nxt < n else n
            free = [s for s in range(prompt_slots) if s not in users and slot_u[s] < u_next]
        n_new = 0
        for b in range(lanes):
            if b in lane_row or nxt >= n:
                continue
            if prompt_slots:
                need = nxt // group - u_open
                if need > len(free):
                    break
                lane_slot[b] = open_slot if need <= 0 else free[need - 1]
                n_new = max(n_new, need)
            lane_row[b], lane_t[b], nxt = nxt, 0, nxt + 1
        if n_new:
            for i in range(n_new):
                slot_u[free[i]] = u_open + 1 + i
            u_open, open_slot = u_open + n_new, free[n_new - 1]
        if not lane_row:
            return
        yield {b: (lane_row[b], lane_t[b]) for b in lane_row}
        for b in list(lane_row):
            lane_t[b] += 1
            if lane_t[b] >= lengths[lane_row[b]]:
                del lane_row[b], lane_t[b]


def kv_slot_reads(
    lengths: np.ndarray,
    slots: int,
    prompt_len: int,
    cap: int,
    group: int = 1,
    prompt_slots_per_shard: int = 0,
) -> dict[str, int]:
    """KV-cache slots the decode's attention reads, summed over steps (each read
    is one slot's k and v in every layer), for the Sampler's decode phases at
    this cap (`decode.decode_chunks`); rows prompt-major, `group` rows per prompt:

      * "static": consecutive calls of `slots` rows, each to its longest row; at
        step t every row reads the end of t's phase of its own slots, and its
        prompt's P slots, once per prompt when `group` > 1 (the shared prompt
        cache, sampling.share_prompt_cache), else once per row;
      * "continuous": `slots` lanes (`lane_schedule`); every lane reads P (its
        own prompt copy) + the end of the phase, which grows when a live lane
        reaches it and never shrinks (share_prompt_cache=False);
      * "continuous_shared" (`group` > 1, share_prompt_cache): the lanes read
        W = `prompt_slots_per_shard` (sampling.continuous_prompt_slots; 0:
        `prompt_slots.suggested_prompt_slots`) prompt slots of P, every slot at
        every step, + their own slots to the phase's end; rows wait for a free
        slot (`lane_schedule` with W), so the schedule may run longer;
      * "ragged": what the (copies') schedule's rows need: each live prompt's P
        (per row when `group` = 1) and each live row's t + 1 own slots at its
        step t: a lower bound for any cache layout.

    Also "continuous_steps" and "continuous_shared_steps": the schedules' steps.
    """
    from gdpo_jax.sampling.decode import decode_chunks
    from gdpo_jax.sampling.prompt_slots import suggested_prompt_slots

    ends = np.cumsum(decode_chunks(cap))

    def phase_end(t: int) -> int:  # own slots of the phase that step t falls in
        return int(ends[np.searchsorted(ends, t, side="right")])

    def prompt_reads(rows: list[int]) -> int:  # a step's prompt slots for these rows
        return prompt_len * (len({r // group for r in rows}) if group > 1 else len(rows))

    static = 0
    for i in range(0, len(lengths), slots):
        call = list(range(i, min(i + slots, len(lengths))))
        steps = int(lengths[call].max())
        static += steps * prompt_reads(call) + len(call) * sum(map(phase_end, range(steps)))
    lanes = min(slots, len(lengths))
    out = {"static": int(static), "continuous": 0, "ragged": 0, "continuous_steps": 0}
    end = int(ends[0])
    for live in lane_schedule(lengths, lanes):
        while max(t for _, t in live.values()) >= end:  # a live lane reached it: grow
            end = phase_end(end)
        out["continuous"] += lanes * (prompt_len + end)
        rows = [r for r, _ in live.values()]
        out["ragged"] += prompt_reads(rows) + sum(t + 1 for _, t in live.values())
        out["continuous_steps"] += 1
    if group > 1:
        w = prompt_slots_per_shard or suggested_prompt_slots(lanes, group)
        end = int(ends[0])
        out["continuous_shared"] = out["continuous_shared_steps"] = 0
        for live in lane_schedule(lengths, lanes, group, w):
            while max(t for _, t in live.values()) >= end:
                end = phase_end(end)
            out["continuous_shared"] += w * prompt_len + lanes * end
            out["continuous_shared_steps"] += 1
    return {k: int(v) for k, v in out.items()}


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


def _measured(lengths: np.ndarray, slots: int, max_new: int, repeats: int) -> dict:
    """Real Sampler runs (tiny random Llama of bench_sampler, greedy, EOS off, each
    row ended at its drawn length by max_new_tokens_per_row), interleaved:
    static calls of `slots` rows (sampling.rows_per_call = slots: the same KV
    cache rows) vs one continuous-batching call with `slots` lanes."""
    from benchmarks.bench_sampler import HF_CONFIG, _write_checkpoint
    from gdpo_jax.models import load_pretrained
    from gdpo_jax.sampling import Sampler, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        _write_checkpoint(tmp)
        model, _ = load_pretrained(tmp)
    rows = len(lengths)
    prompts = np.random.default_rng(0).integers(6, HF_CONFIG["vocab_size"], (rows, PROMPT_LEN))
    prompts = [list(p) for p in prompts]
    params = SamplingParams(max_new_tokens=max_new, greedy=True)
    static = Sampler(model, None, eos_token_ids=())
    cont = Sampler(model, None, eos_token_ids=(), continuous_slots=slots)

    def run_static() -> dict:
        toks, decoded, out = [], 0, []
        for i in range(0, rows, slots):
            ro = static.generate(
                prompts[i : i + slots],
                params,
                key=jax.random.key(0),
                max_new_tokens_per_row=lengths[i : i + slots],
            )
            decoded += ro.info["decoded_tokens"]
            toks.append(ro.completion_ids)
            out.append(ro.lengths)
        return {"decoded": decoded, "tokens": np.concatenate(toks), "lengths": np.concatenate(out)}

    def run_cont() -> dict:
        ro = cont.generate(prompts, params, key=jax.random.key(0), max_new_tokens_per_row=lengths)
        return {
            "decoded": ro.info["decoded_tokens"],
            "tokens": ro.completion_ids,
            "lengths": ro.lengths,
        }

    res, compile_s = {}, {}
    for name, fn in (("static", run_static), ("continuous", run_cont)):
        t0 = time.perf_counter()
        res[name] = fn()  # compiles
        compile_s[name] = round(time.perf_counter() - t0, 2)
    same_rows = np.all(res["static"]["tokens"] == res["continuous"]["tokens"], axis=1)
    same = bool(same_rows.all())
    best = {"static": float("inf"), "continuous": float("inf")}
    for _ in range(repeats):  # interleaved: both see the same machine load
        for name, fn in (("static", run_static), ("continuous", run_cont)):
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    useful = int(lengths.sum())
    out = {
        "greedy_rows_identical": same,
        "greedy_rows_identical_frac": float(same_rows.mean()),
        "useful_tokens": useful,
    }
    for name in best:
        out[name] = {
            "best_s": round(best[name], 3),
            "first_call_s": compile_s[name],
            "decoded_tokens": int(res[name]["decoded"]),
            "useful_tokens_per_s": round(useful / best[name], 1),
            "decoded_tokens_per_s": round(res[name]["decoded"] / best[name], 1),
        }
    out["useful_throughput_ratio"] = round(best["static"] / best["continuous"], 2)
    return out


def run(quick: bool = False, *, median: float = 24.0, sigma: float = 1.0) -> dict:
    slots, max_new = SIZES["quick" if quick else "full"]
    rows = slots * 8
    lengths = longtail_lengths(rows, median=median, sigma=sigma, cap=max_new)
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
        # JAX's f32 matmul precision: "default" is TF32 on GPUs, where it changes
        # which rows' greedy tokens match between the two paths.
        "matmul_precision": str(jax.config.jax_default_matmul_precision or "default"),
        "counts": waste_table(lengths, slots),
        "kv_slot_reads": kv_slot_reads(lengths, slots, PROMPT_LEN, max_new),
        "measured": _measured(lengths, slots, max_new, repeats=2 if quick else 3),
    }


def reads_table_markdown(
    prompt_lens: tuple[int, ...] = (24, 2048), groups: tuple[int, ...] = (1, 4, 8)
) -> str:
    """KV-cache slot reads (`kv_slot_reads`) of both sizes' drawn lengths at each
    prompt length and group size, as multiples of what the rows need ("ragged")."""
    rows = []
    for size, (slots, cap) in SIZES.items():
        lengths = longtail_lengths(8 * slots, median=24.0, sigma=1.0, cap=cap)
        for p in prompt_lens:
            for g in groups:
                r = kv_slot_reads(lengths, slots, p, cap, group=g)
                rows.append(
                    {
                        "size": size,
                        "rows x slots, cap": f"{8 * slots} x {slots}, {cap}",
                        "prompt tokens": p,
                        "rows per prompt": g,
                        "slots the rows need": f"{r['ragged']:,}",
                        "static / need": f"{r['static'] / r['ragged']:.2f}x",
                        "continuous / need": f"{r['continuous'] / r['ragged']:.2f}x",
                        "continuous, prompts shared / need": (
                            f"{r['continuous_shared'] / r['ragged']:.2f}x" if g > 1 else "-"
                        ),
                        "shared: steps vs copies": (
                            f"{r['continuous_shared_steps'] / r['continuous_steps']:.2f}x"
                            if g > 1
                            else "-"
                        ),
                    }
                )
    return common.markdown_table(rows) + (
        "\n\nCounts (no model run): median 24, log-std 1, the Sampler's decode phases; "
        "static calls share a prompt's slots among its rows when it has several (as the "
        "Sampler does); continuous batching copies them into every lane "
        "(the default), or, with shared prompt slots (sampling.continuous_prompt_slots = "
        "W = 3 x lanes / G, `prompt_slots.suggested_prompt_slots`), every lane reads all W "
        "slots' prompts once per step, and rows may wait for a slot (last column)."
    )


def _identical(measured: dict) -> str:
    """ "yes", or "NO" with the share of identical rows where the run recorded it."""
    if measured["greedy_rows_identical"]:
        return "yes"
    frac = measured.get("greedy_rows_identical_frac")
    return "NO" if frac is None else f"NO ({100 * frac:.1f} % of rows identical)"


def table_markdown(runs: list[dict], labels: list[str] | None = None) -> str:
    """One row per run (docs/benchmarks.md shows the committed runs,
    docs/benchmarks/longtail_<size>_<n>.json, in file-name order); `labels`: a
    first column naming each run (e.g. its file, when the runs differ in a
    setting the JSON does not record)."""
    rows = []
    cpus = {common.cpu_label(r.get("machine", {})) for r in runs}
    for i, r in enumerate(runs):
        c, m = r["counts"], r["measured"]
        rows.append(
            ({"run": labels[i]} if labels else {})
            | ({"CPU": common.cpu_label(r.get("machine", {}))} if len(cpus) > 1 else {})
            | {
                "size": "quick" if r["quick"] else "full",
                "rows x slots, cap": f"{c['rows']} x {c['slots']}, {r['lengths']['cap']}",
                "decode work saved (counts)": f"{c['useful_throughput_gain']:.2f}x",
                "static useful tok/s": f"{m['static']['useful_tokens_per_s']:.0f}",
                "continuous useful tok/s": f"{m['continuous']['useful_tokens_per_s']:.0f}",
                "static decoded tok/s": f"{m['static']['decoded_tokens_per_s']:.0f}",
                "continuous decoded tok/s": f"{m['continuous']['decoded_tokens_per_s']:.0f}",
                "useful ratio": f"{m['useful_throughput_ratio']:.2f}x",
                "greedy rows identical": _identical(m),
            }
        )
    lines = [common.markdown_table(rows)]
    mach = runs[0].get("machine", {}) if runs else {}
    if mach and mach.get("backend", "cpu") != "cpu":
        lines.append(
            f"\n{mach.get('device_kind')} x{mach.get('device_count')} ({mach.get('backend')}, "
            f"jax {mach.get('versions', {}).get('jax', '?')}); best of the interleaved repeats."
        )
    elif len(cpus) > 1:
        lines.append("\nBest of the interleaved repeats; each run's CPU in its row.")
    elif mach:
        lines.append(f"\n{common.cpu_label(mach)}; best of the interleaved repeats.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON output path.")
    parser.add_argument("--quick", action="store_true", help="Smaller batch and cap.")
    parser.add_argument("--median", type=float, default=24.0)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument(
        "--reads", action="store_true", help="Only the KV-read counts table (no model run)."
    )
    args = parser.parse_args()
    common.check_out(parser, args.out, "--out", is_dir=False)  # before the run
    if not args.median > 0 or not args.sigma >= 0:  # NaN fails too
        parser.error(
            f"--median={args.median} must be > 0 and --sigma={args.sigma} >= 0 (the log-normal "
            "lengths' median and spread); e.g. --median=24 --sigma=1."
        )
    if args.reads:
        print(reads_table_markdown())
        return
    result = run(quick=args.quick, median=args.median, sigma=args.sigma)
    for k in ("lengths", "counts", "kv_slot_reads", "measured"):
        print(k, result[k])
    print(table_markdown([result]))
    print(f"wrote {common.write_json(args.out, result)}")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
