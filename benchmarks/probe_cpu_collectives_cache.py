r"""Do XLA:CPU programs over several devices, loaded from the persistent cache, abort?

XLA:CPU in jaxlib 0.10.2 can deadlock running a multi-device program loaded from
JAX's persistent compilation cache (gdpo_jax/compile_cache.py). This probe counts
it: for each test program and each XLA_FLAGS setting, one pytest run fills a fresh
cache (a fresh compile; XLA_FLAGS are part of the key), then `--runs` pytest runs load
from it, all while `--load` busy processes keep the cores occupied (the race needs
load). A run that exits non-zero (XLA's "Fatal Python error: Aborted" after the
collective timeout) counts as aborted. The runs use `--noconftest`, which drops the
suite's guard that keeps multi-device programs out of the cache.

    python -m benchmarks.probe_cpu_collectives_cache [--runs 3] [--load 3] \
        [--settings ...] [--programs ...] [--out runs/bench/cpu_collectives_cache.json]

About 15 minutes at the defaults on a 2-core machine. Needs the machine otherwise idle.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import common
from gdpo_jax.xla_cpu import ORDERED_SCHEDULER, SCHEDULER_FLAG

DEFAULT_OUT = "runs/bench/cpu_collectives_cache.json"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = ("tests/test_train_sharded.py", "tests/test_layer_views.py -k mesh")
# XLA's default scheduler named explicitly: `import gdpo_jax` adds the ordered one to
# flags that name neither (gdpo_jax/xla_cpu.py).
DEFAULT_SCHEDULER = f"--{SCHEDULER_FLAG}=true"
SETTINGS = {
    "default scheduler": DEFAULT_SCHEDULER,
    "ordered scheduler": ORDERED_SCHEDULER,
    # Does a longer wait let a loaded program through (slow) or not (a deadlock)?
    "300 s collective timeouts": "--xla_cpu_collective_call_terminate_timeout_seconds=300 "
    f"--xla_cpu_collective_timeout_seconds=300 {DEFAULT_SCHEDULER}",
}
DEFAULT_SETTINGS = ("default scheduler", "ordered scheduler")


def _spin() -> None:
    while True:
        pass


def _pytest(program: str, xla_flags: str, cache_dir: str, timeout_s: float) -> dict[str, Any]:
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        ALLOW_MULTIPLE_LIBTPU_LOAD="1",
        JAX_COMPILATION_CACHE_DIR=cache_dir,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        XLA_FLAGS=f"--xla_force_host_platform_device_count=8 {xla_flags}".strip(),
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider"]
    t0 = time.perf_counter()
    try:
        rc = subprocess.run(
            cmd + program.split(), cwd=ROOT, env=env, capture_output=True, timeout=timeout_s
        ).returncode
    except subprocess.TimeoutExpired:
        rc = None  # hung past the timeout: counted as aborted
    return {"rc": rc, "seconds": round(time.perf_counter() - t0, 1)}


def run(
    runs: int = 3,
    load: int = 3,
    timeout_s: float = 600.0,
    settings: tuple[str, ...] = DEFAULT_SETTINGS,
    programs: tuple[str, ...] = PROGRAMS,
) -> dict[str, Any]:
    """Returns a JSON-able dict: one row per (setting, program)."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(load)]
    for p in spinners:
        p.start()
    rows = []
    try:
        for label in settings:
            flags = SETTINGS[label]
            for program in programs:
                with tempfile.TemporaryDirectory() as cache_dir:
                    fresh = _pytest(program, flags, cache_dir, timeout_s)
                    loaded = [_pytest(program, flags, cache_dir, timeout_s) for _ in range(runs)]
                rows.append(
                    {
                        "setting": label,
                        "xla_flags": flags,
                        "program": program,
                        "fresh_passed": fresh["rc"] == 0,
                        "fresh_s": fresh["seconds"],
                        "loaded_runs": runs,
                        "loaded_aborted": sum(r["rc"] != 0 for r in loaded),
                        "loaded_s": [r["seconds"] for r in loaded],
                    }
                )
                print(common.text_table(rows[-1:]), flush=True)
    finally:
        for p in spinners:
            p.terminate()
    return {
        "benchmark": "cpu_collectives_cache",
        "machine": common.machine_info(),
        "command": common.command_line(),
        "measured_at": common.now_iso(),
        "load_processes": load,
        "results": rows,
    }


def format_table(results: list[dict[str, Any]]) -> str:
    """Markdown table of result rows (one or several runs' "results" concatenated)."""
    lines = [
        "| XLA_FLAGS beside the device count | program | fresh compile | loaded runs | aborted |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        flags = f"`{r['xla_flags']}`" if r["xla_flags"] else "(none)"
        fresh = "passed" if r["fresh_passed"] else "aborted"
        lines.append(
            f"| {flags} | `{r['program']}` | {fresh} | {r['loaded_runs']} | {r['loaded_aborted']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="Loaded runs per cell.")
    parser.add_argument("--load", type=int, default=3, help="Busy processes as load.")
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds per pytest run.")
    parser.add_argument(
        "--settings", nargs="+", choices=sorted(SETTINGS), default=list(DEFAULT_SETTINGS)
    )
    parser.add_argument("--programs", nargs="+", default=list(PROGRAMS), help="pytest args.")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON output path.")
    args = parser.parse_args()
    common.check_out(parser, args.out, "--out", is_dir=False)  # before the run
    result = run(
        runs=args.runs,
        load=args.load,
        timeout_s=args.timeout,
        settings=tuple(args.settings),
        programs=tuple(args.programs),
    )
    cols = ["setting", "program", "fresh_passed", "loaded_runs", "loaded_aborted"]
    print(common.text_table(result["results"], cols))
    print(f"wrote {common.write_json(args.out, result)}")


if __name__ == "__main__":
    main()
