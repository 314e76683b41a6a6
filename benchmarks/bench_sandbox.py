"""Benchmark: what the code sandbox costs per program, and the code reward's throughput.

Generated code runs in `gdpo_jax.rewards.sandbox.run_program`: one driver
process per program (under `unshare` in the namespace modes), which runs each
test case in a child of its own. This measures, on this machine:

* **per program**, for every isolation mode the machine allows (the weak ones
  opted into here; a run never picks them by itself; root is refused
  "rlimits"): the median wall time of
  a one-case and of an eight-case stdin program that reverses its input, and
  from them the cost of one more case and the overhead over a bare start of
  the interpreter with the driver's flags (``python -I -S -B -c pass``; also
  with ``site``, ``-I -B``, timed in the same run); in the strongest mode also
  the same program naming every module the sandbox may preload;
* **the reward**: `code_pass_rate` through `RewardRunner` (as the trainer calls
  it) on a batch of distinct completions with 4 tests each, half correct and
  half wrong, at 1, 2 and 4 worker threads, in the strongest mode; completions
  per second, and the same batch again (served by the reward's memo, which
  never runs a program twice). Scores are checked: 1.0 for the correct
  programs, 0.0 for the wrong ones.

Timings are wall clock on a shared machine: medians of interleaved repeats.

    python -m benchmarks.bench_sandbox [--quick] [--out runs/bench/sandbox.json]
"""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks import common

DEFAULT_OUT = "runs/bench/sandbox.json"
# Reverses its stdin; the wrong variant prints it unchanged.
_RIGHT = "import sys\nprint(sys.stdin.read().strip()[::-1])\n"
_WRONG = "import sys\nprint(sys.stdin.read().strip())\n"
_TESTS = {
    "inputs": ["abc", "hello", "x1y2", "sandbox"],
    "outputs": ["cba", "olleh", "2y1x", "xobdnas"],
}


def available_modes() -> list[str]:
    """The isolation modes this machine allows, strongest first."""
    from gdpo_jax.rewards.isolation import MODES, isolation

    # The weak modes are opted into on purpose here: their warning would only repeat that.
    logging.getLogger("gdpo_jax.sandbox").setLevel(logging.ERROR)

    out = []
    for mode in MODES:
        try:
            isolation(mode, allow_weak=True)
        except RuntimeError:
            continue
        out.append(mode)
    return out


def per_program(modes: list[str], repeats: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(bare interpreter starts in ms, one row per mode and program): 1- and 8-case medians.

    Programs: "plain" names no module the sandbox preloads; "all preloads" names every
    one of them in a comment, so the sandbox imports them all before its first case
    (the preload's own cost), timed in the strongest mode only.
    """
    from gdpo_jax.rewards import sandbox

    everything = "# " + " ".join(sandbox.DEFAULT_PRELOAD) + "\n" + _RIGHT

    def program(mode: str, source: str, cases: int) -> Callable[[], None]:
        def call() -> None:
            res = sandbox.run_program(
                source, [f"case{i}" for i in range(cases)], isolation_mode=mode, allow_weak=True
            )
            bad = [c.status for c in res.cases if c.status != "ok"]
            if bad or res.cases[0].stdout.strip() != "0esac":
                raise RuntimeError(f"sandbox mode {mode!r} did not run the program: {bad}")

        return call

    def bare(*flags: str) -> Callable[[], None]:
        return lambda: subprocess.run([sys.executable, *flags, "-c", "pass"], check=True)

    cases = [(m, "plain", _RIGHT) for m in modes] + [(modes[0], "all preloads", everything)]
    fns = [bare("-I", "-S", "-B"), bare("-I", "-B")]
    fns += [program(m, src, n) for m, _, src in cases for n in (1, 8)]
    ms = [1e3 * t["median_s"] for t in common.time_interleaved(fns, repeats=repeats, warmup=1)]
    bare_ms = {"no_site": round(ms[0], 1), "site": round(ms[1], 1)}
    rows = []
    for i, (mode, name, _) in enumerate(cases):
        one, eight = ms[2 + 2 * i], ms[3 + 2 * i]
        rows.append(
            {
                "mode": mode,
                "program": name,
                "program_1_case_ms": round(one, 1),
                "program_8_cases_ms": round(eight, 1),
                "per_extra_case_ms": round((eight - one) / 7, 2),
                "over_bare_interpreter_ms": round(one - bare_ms["no_site"], 1),
            }
        )
    return bare_ms, rows


def reward_throughput(mode: str, completions: int, workers: tuple[int, ...]) -> list[dict]:
    """code_pass_rate over `completions` distinct programs (half wrong) per worker count."""
    from gdpo_jax.rewards.runner import RewardRunner, RewardSpec

    spec = RewardSpec("code_pass_rate", kwargs={"isolation": mode, "allow_weak": True})
    run_id = uuid.uuid4().hex  # a fresh program text per run: the reward's memo is per process
    counter = itertools.count()
    rows = []
    for w in workers:
        # Distinct sources (a comment differs), so each is a real sandbox run.
        srcs = [
            (f"# {run_id} {next(counter)}\n" + (_RIGHT if i % 2 == 0 else _WRONG))
            for i in range(completions)
        ]
        comps = [f"```python\n{s}```" for s in srcs]
        examples = [{"tests": _TESTS}] * completions
        expected = [1.0 if i % 2 == 0 else 0.0 for i in range(completions)]
        with RewardRunner([spec], num_workers=w, timeout_s=120.0) as runner:
            t0 = time.perf_counter()
            rewards, _ = runner([""] * completions, comps, examples)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            again, _ = runner([""] * completions, comps, examples)
            memo = time.perf_counter() - t0
        scores = rewards[:, 0].tolist()
        if scores != expected or again[:, 0].tolist() != expected:
            raise RuntimeError(f"code_pass_rate scored {scores}, expected {expected}")
        rows.append(
            {
                "mode": mode,
                "workers": w,
                "completions": completions,
                "tests_each": len(_TESTS["inputs"]),
                "seconds": round(first, 3),
                "completions_per_s": round(completions / first, 1),
                "ms_per_completion": round(1e3 * first / completions, 1),
                "memo_replay_s": round(memo, 4),
            }
        )
    return rows


def run(quick: bool = False) -> dict[str, Any]:
    """Returns a JSON-able dict."""
    modes = available_modes()
    if not modes:
        raise RuntimeError("no sandbox isolation mode works on this machine")
    bare_ms, programs = per_program(modes, 3 if quick else 15)
    reward = reward_throughput(modes[0], 8 if quick else 32, (1, 2) if quick else (1, 2, 4))
    return {
        "benchmark": "sandbox",
        "quick": quick,
        "machine": common.machine_info(),
        "command": common.command_line(),
        "date": common.now_iso(),
        "bare_interpreter_ms": bare_ms,
        "programs": programs,
        "reward": reward,
    }


def format_table(result: dict) -> str:
    """Both tables as markdown, headed by the machine."""
    info, bare = result["machine"], result["bare_interpreter_ms"]
    machine = f"{common.machine_kind(info)}: {common.describe_machine(info)}"
    out = (
        f"Sandbox per program ({machine}); median wall ms; a bare interpreter start took "
        f"{bare['no_site']} ms with the driver's flags (`python -I -S -B -c pass`) and "
        f"{bare['site']} ms with `site` (`-I -B`)\n\n"
        + common.markdown_table(result["programs"])
        + f"\n\n`code_pass_rate` through RewardRunner ({machine}), mode "
        f"{result['reward'][0]['mode']}; distinct programs, half of them wrong (scores checked)\n\n"
        + common.markdown_table(result["reward"])
    )
    return out


def main() -> None:
    common.quick_out_main(__doc__, run, format_table, DEFAULT_OUT, "Fewer repeats and completions.")


if __name__ == "__main__":
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    main()
