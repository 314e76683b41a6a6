"""Run every benchmark of the project and write one JSON + one markdown table.

    python -m benchmarks.run_all [--quick] [--out_dir runs/bench] [--only bench_model,bench_rl]

Each benchmark is a module ``benchmarks/<name>.py`` exposing
``run(quick: bool) -> dict``: advantages, model forward/backward, sampler vs
transformers, RL iteration vs TRL. A module that does not exist yet is noted
as "missing"; one that raises is noted as "error" with its traceback, and the
others still run. By default each benchmark runs in its own Python process
(``--isolate``), so one benchmark's threads, compilation caches, memory or a
hard crash cannot change another's numbers.

Writes ``<out_dir>/latest.json`` and ``<out_dir>/latest.md`` (and a
time-stamped copy of the JSON), both with the machine description and a
matmul peak measured in the same run: compare figures across machines as
ratios to that peak, not as absolute numbers.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks import common

BENCHMARKS = ("bench_advantages", "bench_model", "bench_sampler", "bench_rl")
DEFAULT_OUT_DIR = "runs/bench"


def _module_name(name: str) -> str:
    return name if "." in name else f"benchmarks.{name}"


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package
        return False


MACHINE = "__machine__"  # pseudo-benchmark: machine description + matmul peak


def _machine_and_peak(quick: bool, measure_peak: bool = True) -> dict[str, Any]:
    out = {"machine": common.machine_info(), "matmul_peak": None}
    if measure_peak:
        out["matmul_peak"] = common.matmul_peak(repeats=3 if quick else 5)
    return out


def _run_inline(module: str, quick: bool) -> dict[str, Any]:
    """Imports and runs one benchmark in this process; never raises."""
    t0 = time.perf_counter()
    try:
        if module == MACHINE:
            return {
                "status": "ok",
                "seconds": time.perf_counter() - t0,
                "result": common.to_jsonable(_machine_and_peak(quick)),
            }
        mod = importlib.import_module(module)
        if not callable(getattr(mod, "run", None)):
            raise AttributeError(f"{module} has no run(quick: bool) -> dict function.")
        result = mod.run(quick=quick)
        if not isinstance(result, Mapping):
            raise TypeError(f"{module}.run returned {type(result).__name__}, expected a dict.")
        return {
            "status": "ok",
            "seconds": time.perf_counter() - t0,
            "result": common.to_jsonable(result),
        }
    except Exception as e:  # noqa: BLE001 - one broken benchmark must not stop the rest
        return {
            "status": "error",
            "seconds": time.perf_counter() - t0,
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc(),
        }


def _run_isolated(module: str, quick: bool, timeout_s: float | None) -> dict[str, Any]:
    """Runs one benchmark in a child Python process (same interpreter, same env)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "benchmarks.run_all", "--_child", module, "--_child_out", out]
        if quick:
            cmd.append("--quick")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            return {
                "status": "error",
                "seconds": time.perf_counter() - t0,
                "error": f"timed out after {timeout_s} s",
                "stderr_tail": _tail(e.stderr),
            }
        sys.stdout.write(proc.stdout)  # the benchmark's own printout, as it would appear inline
        if os.path.exists(out):
            with open(out) as f:
                rec = json.load(f)
            if rec["status"] != "ok":
                rec["stderr_tail"] = _tail(proc.stderr)
            return rec
        return {
            "status": "error",
            "seconds": time.perf_counter() - t0,
            "error": f"benchmark process exited with code {proc.returncode} and no result",
            "stderr_tail": _tail(proc.stderr),
        }


def _tail(text: str | bytes | None, n: int = 3000) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-n:]


def run_benchmarks(
    names: Sequence[str] = BENCHMARKS,
    *,
    quick: bool = False,
    isolate: bool = True,
    timeout_s: float | None = None,
    measure_peak: bool = True,
) -> dict[str, Any]:
    """Runs the named benchmarks; returns the full report (see module docstring).

    names: module names under ``benchmarks/`` (or dotted module paths).
    """
    report: dict[str, Any] = {
        "created": common.now_iso(),
        "command": common.command_line(),
        "quick": quick,
        "isolated": isolate,
        "benchmarks": {},
    }
    # With isolation this process never starts a JAX backend: on a GPU it would
    # otherwise hold (preallocate) memory that the benchmark processes need.
    if isolate and measure_peak:
        rec = _run_isolated(MACHINE, quick, timeout_s)
        if rec["status"] != "ok":
            raise RuntimeError(
                f"measuring the machine failed: {rec['error']}\n{rec.get('stderr_tail', '')}"
            )
        report.update(rec["result"])
    else:
        report.update(_machine_and_peak(quick, measure_peak))
    if report["matmul_peak"]:
        peak = report["matmul_peak"]
        print(
            f"matmul peak: {peak['gflops_per_s']:.1f} GFLOP/s ({peak['dtype']}, n={peak['n']}, "
            f"{peak['device_kind']})",
            flush=True,
        )
    for name in names:
        module = _module_name(name)
        if not _exists(module):
            print(f"[{name}] missing: no module {module}; skipped", flush=True)
            report["benchmarks"][name] = {
                "status": "missing",
                "note": f"no module {module} (not written yet)",
            }
            continue
        print(f"[{name}] running{' (quick)' if quick else ''} ...", flush=True)
        rec = _run_isolated(module, quick, timeout_s) if isolate else _run_inline(module, quick)
        report["benchmarks"][name] = rec
        msg = f"ok in {rec['seconds']:.1f} s" if rec["status"] == "ok" else rec["error"]
        print(f"[{name}] {msg}", flush=True)
    return report


def report_to_markdown(report: Mapping[str, Any]) -> str:
    """The human-readable table: machine, peak, a status summary, then each benchmark."""
    m = report["machine"]
    lines = [
        f"# Benchmarks ({'quick' if report['quick'] else 'full'})",
        "",
        f"Run {report['created']}: `{report['command']}`",
        "",
        f"Machine: {common.describe_machine(m)}",
        "",
    ]
    versions = {k: v for k, v in m["versions"].items() if v}
    lines += [common.markdown_table([versions]), ""]
    peak = report.get("matmul_peak")
    if peak:
        lines += [
            f"Measured matmul peak: **{peak['gflops_per_s']:.1f} GFLOP/s** "
            f"({peak['dtype']} {peak['n']}x{peak['n']}, jitted, best of {peak['repeats']}, "
            f"precision {peak['precision']}). Compare throughputs across machines as "
            "ratios to this peak.",
            "",
        ]
    summary = [
        {
            "benchmark": k,
            "status": v["status"],
            "seconds": round(v["seconds"], 1) if "seconds" in v else None,
            "note": v.get("error") or v.get("note") or "",
        }
        for k, v in report["benchmarks"].items()
    ]
    lines += ["## Summary", "", common.markdown_table(summary), ""]
    for name, rec in report["benchmarks"].items():
        if rec["status"] == "ok":
            # A benchmark's own copy of the machine description repeats the header.
            result = {k: v for k, v in rec["result"].items() if k != "machine"}
            lines += [f"## {name}", "", common.result_to_markdown(result), ""]
    return "\n".join(lines)


def write_report(report: Mapping[str, Any], out_dir: str) -> tuple[str, str]:
    """Writes latest.json, latest.md and bench-<timestamp>.json; returns (json, md) paths."""
    stamp = report["created"].replace(":", "").replace("-", "")
    common.write_json(os.path.join(out_dir, f"bench-{stamp}.json"), report)
    js = common.write_json(os.path.join(out_dir, "latest.json"), report)
    md = common.write_text(os.path.join(out_dir, "latest.md"), report_to_markdown(report))
    return js, md


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes / few repeats (CI)")
    p.add_argument("--out_dir", default=DEFAULT_OUT_DIR)
    p.add_argument("--only", default="", help="comma-separated subset of " + ",".join(BENCHMARKS))
    p.add_argument(
        "--no_isolate",
        action="store_true",
        help="run every benchmark in this process (faster start, less isolation)",
    )
    p.add_argument("--timeout_s", type=float, default=0.0, help="per benchmark; 0 = none")
    p.add_argument("--_child", default="", help=argparse.SUPPRESS)
    p.add_argument("--_child_out", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args._child:  # one isolated benchmark; the parent reads the file
        common.write_json(args._child_out, _run_inline(args._child, args.quick))
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    report = run_benchmarks(
        names, quick=args.quick, isolate=not args.no_isolate, timeout_s=args.timeout_s or None
    )
    js, md = write_report(report, args.out_dir)
    print(f"\nwrote {js} and {md}")
    bad = [k for k, v in report["benchmarks"].items() if v["status"] == "error"]
    if bad:
        print(f"benchmarks with errors: {', '.join(bad)} (see {js})", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
