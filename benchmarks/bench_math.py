"""Benchmark: what the math correctness reward costs, per comparison and per batch.

`math_correct` (gdpo_jax.tasks.math) compares the last boxed answer with the
reference: equal after `normalize_answer` is a string check in the caller;
anything else goes to math-verify (sympy), which runs in a helper process per
reward thread under a hard deadline (gdpo_jax.tasks.math_verifier). This
measures, on this machine:

* **helper start**: a new helper process, up to its "ready" (importing sympy and
  math-verify, one warm-up comparison); every reward thread pays it once;
* **per comparison**: `is_equivalent` on answer pairs of typical kinds
  (equivalent forms, wrong answers, one caught by the string check), median ms
  on a warm helper, every comparison a new pair (no cache answers it); each
  verdict is checked against the hand-worked one;
* **a pathological answer** (`9^{9^{9^{9}}}`, which sympy would evaluate for
  ever, GIL held): the time to its TimeoutError at a 1 s deadline, and the next
  comparison's, which starts a fresh helper;
* **the reward**: `math_correct` through `RewardRunner` (as the trainer calls
  it) on a batch of completions cycling through the pairs, at 1, 2 and 4 worker
  threads: the first call (each thread starts its helper) and a second call on
  the same runner with new answers (warm). Scores are checked.

    python -m benchmarks.bench_math [--quick] [--out runs/bench/math.json]
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks import common

DEFAULT_OUT = "runs/bench/math.json"
# kind -> k -> (predicted answer, reference answer, equivalent?), verdicts worked by hand
# for every k >= 2. Each comparison takes a k of its own: math-verify's parse caches
# and sympy's expression cache would answer a repeated pair without the work.
PAIRS: dict[str, Callable[[int], tuple[str, str, bool]]] = {
    "same after normalize_answer": lambda k: (f"[0,{k})", f"[0, {k})", True),
    "decimal vs fraction": lambda k: (f"{k}.5", f"\\frac{{{2 * k + 1}}}{{2}}", True),
    "slash vs \\frac": lambda k: (f"{k}/{k + 1}", f"\\frac{{{k}}}{{{k + 1}}}", True),
    "surds": lambda k: (f"{k}\\sqrt{{2}}", f"\\sqrt{{{2 * k * k}}}", True),
    "rationalized surd": lambda k: (f"\\sqrt{{{k}}}/{k}", f"\\frac{{1}}{{\\sqrt{{{k}}}}}", True),
    "symbolic constant": lambda k: (f"{k}\\pi/2", f"\\frac{{{k}\\pi}}{{2}}", True),
    "expanded polynomial": lambda k: (f"(x+{k})^2", f"x^2+{2 * k}x+{k * k}", True),
    "set order": lambda k: (f"\\{{{k + 1},{k}\\}}", f"\\{{{k},{k + 1}\\}}", True),
    "percent": lambda k: (f"{k}\\%", f"{k / 100:g}", True),
    "wrong integer": lambda k: (f"{k}", f"{k + 1}", False),
    "rounded fraction": lambda k: (f"\\frac{{{3 * k + 1}}}{{3}}", f"{(3 * k + 1) / 3:.2f}", False),
    "wrong expression": lambda k: (f"{k + 1}x", f"x+{k}x+1", False),
}
PATHOLOGICAL = "9^{9^{9^{9}}}"


def helper_start(repeats: int) -> dict[str, float]:
    """Seconds from starting a math-verify helper process to its "ready" line."""
    from gdpo_jax.tasks.math_verifier import STARTUP_TIMEOUT_S, _Helper

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        helper = _Helper()  # launched; its imports run until "ready"
        if not helper.wait_ready(STARTUP_TIMEOUT_S):
            raise RuntimeError("the math-verify helper did not start")
        times.append(time.perf_counter() - t0)
        helper.kill()
    return {"median_s": round(statistics.median(times), 3), "best_s": round(min(times), 3)}


def per_comparison(repeats: int) -> list[dict[str, Any]]:
    """One row per kind: the verdicts (checked) and the median ms of `is_equivalent`
    over `repeats` comparisons, each with its own k (k = 2, 3, ...), kinds interleaved."""
    from gdpo_jax.tasks.math import is_equivalent, normalize_answer

    is_equivalent("1", "2")  # this thread's helper is started: comparisons only below
    times: dict[str, list[float]] = {kind: [] for kind in PAIRS}
    for r in range(repeats):
        for kind, make in PAIRS.items():
            pred, gold, want = make(2 + r)
            t0 = time.perf_counter()
            got = is_equivalent(pred, gold)
            times[kind].append(time.perf_counter() - t0)
            if got != want:
                raise RuntimeError(f"is_equivalent({pred!r}, {gold!r}) = {got}, expected {want}")
    rows = []
    for kind, make in PAIRS.items():
        pred, gold, want = make(2)
        rows.append(
            {
                "kind": kind,
                "example (k=2)": f"`{pred}` vs `{gold}`",
                "equivalent": want,
                "path": "string" if normalize_answer(pred) == normalize_answer(gold) else "sympy",
                "median_ms": round(1e3 * statistics.median(times[kind]), 2),
                "max_ms": round(1e3 * max(times[kind]), 2),
            }
        )
    return rows


def pathological(timeout_s: float = 1.0) -> dict[str, float]:
    """Seconds to the TimeoutError of PATHOLOGICAL, then the next comparison's seconds
    (a fresh helper). Runs in its own thread, so it starts with a helper of its own."""
    from gdpo_jax.tasks.math import is_equivalent

    out: dict[str, Any] = {}

    def body() -> None:
        is_equivalent("1", "2")  # warm helper first: the deadline is the comparison's
        t0 = time.perf_counter()
        try:
            is_equivalent(PATHOLOGICAL, "1", timeout_s=timeout_s)
            out["timed_out"] = False
        except TimeoutError:
            out["timed_out"] = True
        out["to_timeout_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        out["next_ok"] = is_equivalent("0.5", "\\frac{1}{2}")
        out["next_comparison_s"] = round(time.perf_counter() - t0, 3)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if not out.get("timed_out") or not out.get("next_ok"):
        raise RuntimeError(f"the pathological answer did not time out cleanly: {out}")
    return {"deadline_s": timeout_s, **out}


def _batch(n: int, k0: int) -> tuple[list[str], list[dict], list[float]]:
    """n boxed completions cycling through the kinds, k = k0, k0 + 1, ... per cycle."""
    comps, examples, expected = [], [], []
    kinds = list(PAIRS.values())
    for i in range(n):
        pred, gold, want = kinds[i % len(kinds)](k0 + i // len(kinds))
        comps.append(f"So the answer is $\\boxed{{{pred}}}$.")
        examples.append({"ground_truth": gold})
        expected.append(1.0 if want else 0.0)
    return comps, examples, expected


def reward_throughput(completions: int, workers: tuple[int, ...], k0: int) -> list[dict[str, Any]]:
    """math_correct over `completions` boxed answers per worker count: a first call (each
    thread starts its helper), then a second call on the same runner with other k (warm)."""
    import gdpo_jax.tasks.math  # noqa: F401 - registers math_correct
    from gdpo_jax.rewards.runner import RewardRunner, RewardSpec

    rows = []
    per_call = -(-completions // len(PAIRS))  # k values one call uses
    for j, w in enumerate(workers):
        secs = []
        with RewardRunner([RewardSpec("math_correct")], num_workers=w, timeout_s=300.0) as runner:
            for call in range(2):
                comps, examples, expected = _batch(completions, k0 + (2 * j + call) * per_call)
                t0 = time.perf_counter()
                got, _ = runner([""] * completions, comps, examples)
                secs.append(time.perf_counter() - t0)
                if got[:, 0].tolist() != expected:
                    raise RuntimeError(
                        f"math_correct scored {got[:, 0].tolist()}, expected {expected}"
                    )
        rows.append(
            {
                "workers": w,
                "completions": completions,
                "first_call_s": round(secs[0], 3),
                "warm_s": round(secs[1], 3),
                "warm_completions_per_s": round(completions / secs[1], 1),
                "warm_ms_per_completion": round(1e3 * secs[1] / completions, 1),
            }
        )
    return rows


def run(quick: bool = False) -> dict[str, Any]:
    """Returns a JSON-able dict."""
    repeats = 2 if quick else 7
    return {
        "benchmark": "math",
        "quick": quick,
        "machine": common.machine_info(),
        "command": common.command_line(),
        "date": common.now_iso(),
        "helper_start": helper_start(1 if quick else 3),
        "comparisons": per_comparison(repeats),
        "pathological": pathological(),
        "reward": reward_throughput(
            12 if quick else 48, (1, 2) if quick else (1, 2, 4), 2 + repeats
        ),
    }


def format_table(result: dict) -> str:
    """The tables as markdown, headed by the machine."""
    info = result["machine"]
    machine = f"{common.machine_kind(info)}: {common.describe_machine(info)}"
    h, p = result["helper_start"], result["pathological"]
    return (
        f"math-verify per comparison ({machine}); `is_equivalent` on a warm helper, "
        f"median ms; a helper process took {h['median_s']} s to start\n\n"
        + common.markdown_table(result["comparisons"])
        + f"\n\n`{PATHOLOGICAL}` against a {p['deadline_s']} s deadline: TimeoutError after "
        f"{p['to_timeout_s']} s; the next comparison (a fresh helper) took "
        f"{p['next_comparison_s']} s\n\n"
        f"`math_correct` through RewardRunner ({machine}); boxed answers cycling through "
        "the kinds above, each answer with a k of its own (scores checked); the first call "
        "starts each thread's helper\n\n" + common.markdown_table(result["reward"])
    )


def main() -> None:
    common.quick_out_main(__doc__, run, format_table, DEFAULT_OUT, "Fewer repeats and completions.")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
