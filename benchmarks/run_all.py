"""Run the benchmarks of a machine kind's table and write one JSON + one markdown table.

    python -m benchmarks.run_all [--quick] [--out_dir runs/bench] [--only bench_model,bench_rl]
    python -m benchmarks.run_all --summary_only --out_dir docs/benchmarks

Each benchmark is a module ``benchmarks/<name>.py`` exposing
``run(quick: bool) -> dict``: advantages, XLA's matmuls vs PyTorch's, model
forward/backward, sampler vs transformers, RL iteration vs TRL, the code
sandbox's and math-verify's cost (the others, e.g. bench_longtail and the
profilers, run alone: docs/benchmarks.md). A
module that does not exist yet is noted as "missing"; one that raises is noted
as "error" with its traceback, and the others still run. By default each
benchmark runs in its own Python process (``--no_isolate``: all in this one),
so one benchmark's threads, compilation caches, memory or a hard crash cannot
change another's numbers.

Writes ``<out_dir>/latest.json`` and ``<out_dir>/latest.md`` (and a
time-stamped copy of the JSON under ``history/``), both with the machine
description and a matmul peak measured in the same run: compare figures across
machines as ratios to that peak, not as absolute numbers. A full run also
writes ``<out_dir>/machines/<kind>.{json,md}`` (the latest full run per machine
kind: CPU model, vector ISA, cores, accelerator) and ``<out_dir>/summary.md``,
one row of headline ratios per machine kind and their range over kinds. Rows
retired from the summary live in ``machines/legacy/`` (`summary.LEGACY_DIR`), which the
summary does not read.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks import common, summary

BENCHMARKS = (
    "bench_advantages",
    "bench_matmul",
    "bench_model",
    "bench_sampler",
    "bench_rl",
    "bench_sandbox",
    "bench_math",
)
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
        # Its own process group: a timeout kills the benchmark's children too (bench_rl's
        # TRL process ran on after its parent was killed, loading the next benchmarks).
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except BaseException as e:  # the timeout, or run_all interrupted
            with contextlib.suppress(ProcessLookupError):  # the group may be gone already
                os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            return {
                "status": "error",
                "seconds": time.perf_counter() - t0,
                "error": f"timed out after {timeout_s} s",
                "stderr_tail": _tail(stderr),
            }
        sys.stdout.write(stdout)  # the benchmark's own printout, as it would appear inline
        if os.path.exists(out):
            with open(out) as f:
                rec = json.load(f)
            if rec["status"] != "ok":
                rec["stderr_tail"] = _tail(stderr)
            return rec
        return {
            "status": "error",
            "seconds": time.perf_counter() - t0,
            "error": f"benchmark process exited with code {proc.returncode} and no result",
            "stderr_tail": _tail(stderr),
        }


def stop_forkserver() -> None:
    """Stops and waits for multiprocessing's forkserver, if this process started one:
    the reward runner's process workers are its children, which it waits for, so their
    CPU time then reaches this process's `RUSAGE_CHILDREN` (`reap_children`)."""
    import multiprocessing.forkserver as forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # CPython's, 3.8+
    if stop is not None:
        stop()


def _child_pids(proc: str = "/proc") -> list[int]:
    """This process's live children (Linux's /proc; [] elsewhere)."""
    me, out = os.getpid(), []
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return []
    for e in entries:
        try:
            with open(os.path.join(proc, e, "stat")) as f:
                # pid (comm) state ppid ...: comm may hold spaces and parentheses.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me:
            out.append(int(e))
    return out


def reap_children() -> None:
    """Stops and waits for the processes a benchmark left running, at its end.

    Helper processes that outlive the benchmark until this process exits (the reward
    runner's forkserver, which waits for its workers; math-verify's per-thread helpers)
    are never waited for, so their CPU time never reached the parent's
    `RUSAGE_CHILDREN` and `common.host_activity` counted it as other processes'
    (bench_math: 36 % of the cores, 2026-12-05). Waited here, it is the benchmark's.
    """
    stop_forkserver()
    pids = _child_pids()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)  # what this process's exit would bring them
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


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
        before = common.host_counters()
        rec = _run_isolated(module, quick, timeout_s) if isolate else _run_inline(module, quick)
        # Whether other work shared the machine meanwhile (summary.md marks it).
        rec["host"] = common.host_activity(before, common.host_counters())
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
        *(
            f"Updated {u['created']}: `{u['command']}` ({', '.join(u['benchmarks'])})\n"
            for u in report.get("updates", [])
        ),
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
            "other processes' CPU": _fmt_frac(v.get("host", {}).get("other_cpu_frac")),
            "load avg at start": _fmt_load(v.get("host", {}).get("load_avg_start")),
            "note": v.get("error") or v.get("note") or "",
        }
        for k, v in report["benchmarks"].items()
    ]
    lines += [
        "## Summary",
        "",
        common.markdown_table(summary),
        "",
        "Other processes' CPU: the CPU time processes other than the benchmark's used while "
        "it ran, as a share of all cores' time (`common.host_activity`; blank in runs "
        f"before it was recorded). Above {common.LOADED_FRAC:.0%} the summary marks the "
        "benchmark's ratios ‡.",
        "",
    ]
    for name, rec in report["benchmarks"].items():
        if rec["status"] == "ok":
            # A benchmark's own copy of the machine description repeats the header.
            result = {k: v for k, v in rec["result"].items() if k != "machine"}
            lines += [f"## {name}", "", common.result_to_markdown(result), ""]
    return "\n".join(lines)


def merge_partial(report: Mapping[str, Any], previous: Mapping[str, Any]) -> dict[str, Any]:
    """The machine file after a run of only some benchmarks (``--only``), or a full run
    some of whose benchmarks failed: the kind's previous file with the entries that ran
    replaced, and the run listed
    under "updates" ({created, command, benchmarks, matmul_peak}); the others, and the
    run they came from ("created", "command", "matmul_peak"), stay. Each entry's
    result carries its own machine description.

    Only entries with status "ok" replace the previous ones: a partial run that
    crashed or timed out would otherwise overwrite the kind's published result with
    an error record, and the kind would drop out of the summary's ranges. Such entries
    are listed under the update's "not_merged" ({name: status}); a run with nothing
    to merge leaves the file as it was."""
    merged = {k: v for k, v in report["benchmarks"].items() if v.get("status") == "ok"}
    if not merged:
        return dict(previous)
    update = {k: report.get(k) for k in ("created", "command", "matmul_peak")}
    update["benchmarks"] = list(merged)
    skipped = {k: v.get("status") for k, v in report["benchmarks"].items() if k not in merged}
    if skipped:
        update["not_merged"] = skipped
    return dict(previous) | {
        "benchmarks": dict(previous["benchmarks"]) | merged,
        "updates": [*previous.get("updates", []), update],
    }


def write_report(report: Mapping[str, Any], out_dir: str) -> tuple[str, str]:
    """Writes latest.json, latest.md, history/bench-<timestamp>.json, this machine kind's
    machines/<kind>.{json,md} and summary.md over every machines/*.json. A full run of
    every benchmark, all of them ok, replaces the kind's file; a full run of some
    (``--only``), or one where some failed, updates the entries that ran in it
    (`merge_partial`: a failed one keeps its published entry); a quick run never touches it.
    Returns the (json, md) paths of this run."""
    stamp = report["created"].replace(":", "").replace("-", "")
    common.write_json(os.path.join(out_dir, "history", f"bench-{stamp}.json"), report)
    js = common.write_json(os.path.join(out_dir, "latest.json"), report)
    md = common.write_text(os.path.join(out_dir, "latest.md"), report_to_markdown(report))
    if not report["quick"]:
        kind = common.machine_kind(report["machine"])
        mdir = os.path.join(out_dir, "machines")
        path = os.path.join(mdir, f"{kind}.json")
        kept = report
        failed = any(v.get("status") != "ok" for v in report["benchmarks"].values())
        if (set(report["benchmarks"]) != set(BENCHMARKS) or failed) and os.path.exists(path):
            with open(path) as f:
                kept = merge_partial(report, json.load(f))
        common.write_json(path, kept)
        common.write_text(os.path.join(mdir, f"{kind}.md"), report_to_markdown(kept))
        common.write_text(os.path.join(out_dir, "summary.md"), summary.summary_markdown(mdir))
    return js, md


def _fmt_frac(x: float | None) -> str:
    return "" if x is None else f"{x:.1%}"


def _fmt_load(x: Sequence[float] | None) -> str:
    return "" if not x else f"{x[0]:.2f}"


def _importable(name: str) -> bool:
    """A module name that resolves (a benchmark outside BENCHMARKS, e.g. a test's)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name if "." in name else f"benchmarks.{name}") is not None
    except (ImportError, ValueError):
        return False


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
    p.add_argument(
        "--summary_only",
        action="store_true",
        help="only rewrite <out_dir>/summary.md from <out_dir>/machines/*.json",
    )
    p.add_argument("--_child", default="", help=argparse.SUPPRESS)
    p.add_argument("--_child_out", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args._child:  # one isolated benchmark; the parent reads the file
        common.write_json(args._child_out, _run_inline(args._child, args.quick))
        reap_children()
        return 0
    common.check_out(p, args.out_dir, "--out_dir", is_dir=True)
    if args.timeout_s < 0:
        p.error(f"--timeout_s={args.timeout_s} must be >= 0 (0 = no limit).")
    unknown = [
        n
        for n in (n.strip() for n in args.only.split(","))
        if n and n not in BENCHMARKS and not _importable(n)
    ]
    if unknown:  # a typo: fail before the machine is measured and latest.json rewritten
        p.error(f"--only: no benchmark {unknown}; known: {', '.join(BENCHMARKS)}.")
    if args.summary_only:
        if not os.path.isdir(os.path.join(args.out_dir, "machines")):
            p.error(f"--summary_only: {args.out_dir}/machines holds no machine files to summarize.")
        path = os.path.join(args.out_dir, "summary.md")
        common.write_text(path, summary.summary_markdown(os.path.join(args.out_dir, "machines")))
        print(f"wrote {path}")
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
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # huge pages for XLA:CPU buffers (gdpo_jax/hostenv.py)
    sys.exit(main())
