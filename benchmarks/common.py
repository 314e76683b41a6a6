"""Shared benchmark helpers: machine description, a measured matmul peak, timing,
and the JSON / markdown writers used by ``benchmarks/run_all.py``.

Absolute throughput means little across machines; a benchmark that reports
its FLOP/s next to :func:`matmul_peak` measured in the same run gives a ratio
(model FLOPs utilization) that does compare.

    from benchmarks import common
    info = common.machine_info()             # CPU, cores, memory, versions, backend
    peak = common.matmul_peak()              # {"flops_per_s": ..., "n": 2048, ...}
    print(common.markdown_table(rows))       # rows: list of dicts
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Whether other work or the kernel's memory shared a benchmark's run (benchmarks/host.py),
# re-exported: the benchmarks call them through this module.
from benchmarks.host import LOADED_FRAC as LOADED_FRAC
from benchmarks.host import VMSTAT_KEYS as VMSTAT_KEYS
from benchmarks.host import host_activity as host_activity
from benchmarks.host import host_counters as host_counters

# Versions worth recording next to a number (torch/trl are benchmark baselines).
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "transformers", "torch", "trl")


# --------------------------------------------------------------------------- #
# Machine description
# --------------------------------------------------------------------------- #
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_isa() -> str:
    """The widest x86 vector extension the CPU reports (avx512 / avx2 / ...), else ''."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    for isa, flag in (("avx512", "avx512f"), ("avx2", "avx2"), ("avx", "avx")):
                        if flag in flags:
                            return isa
                    return ""
    except OSError:
        pass
    return ""


def _cpu_details(cpuinfo: str = "/proc/cpuinfo", sysfs: str = "/sys/devices/system/cpu") -> dict:
    """What tells apart hosts behind one VM model name ("Intel(R) Xeon(R) Processor"):
    the reported clock (MHz), the last-level cache and whether AMX tiles are there.
    Recorded beside a run, not part of the machine kind; None where unreadable."""
    out: dict[str, Any] = {"mhz": None, "l3_cache": None, "amx": None}
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("cpu MHz") and out["mhz"] is None:
                    out["mhz"] = float(line.split(":", 1)[1])
                elif line.startswith("flags") and out["amx"] is None:
                    out["amx"] = "amx_tile" in line.split(":", 1)[1].split()
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(sysfs, "cpu0", "cache", "index3", "size")) as f:
            out["l3_cache"] = f.read().strip()
    except OSError:
        pass
    return out


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)  # kB -> GiB
    except OSError:
        pass
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """Where the numbers came from: CPU, cores, memory, package versions, JAX backend.

    Package versions are read from the installed metadata (torch is never
    imported here). Initializes the JAX backend.
    """
    import jax

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    devices = jax.devices()
    return {
        "cpu_model": _cpu_model(),
        "cpu_isa": _cpu_isa(),
        "cpu_details": _cpu_details(),
        "cpu_count": os.cpu_count(),
        "cpu_usable": usable,
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in PACKAGES},
        "backend": jax.default_backend(),
        "device_kind": getattr(devices[0], "device_kind", str(devices[0])),
        "device_count": len(devices),
        "process_count": jax.process_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
    }


def machine_kind(info: Mapping[str, Any]) -> str:
    """File-name slug of a machine kind: CPU model, its widest vector ISA (the same
    model name covers CPUs of different generations in VMs) and usable cores, plus
    the accelerator when the backend is not the CPU, e.g. 'amd-epyc-avx512-2c' or
    'intel-xeon-platinum-8481c-avx512-16c-gpu-nvidia-h100-80gb-hbm3-x1'."""
    text = f"{info['cpu_model']} {info.get('cpu_isa', '')} {info['cpu_usable']}c"
    if info.get("backend", "cpu") != "cpu":
        text += f" {info['backend']} {info['device_kind']} x{info['device_count']}"
    text = re.sub(r"\((r|tm)\)|\bcpu\b|@.*?ghz|\bprocessor\b", " ", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def torch_device() -> str:
    """Where a torch reference runs beside us: "cuda" when JAX's backend is a GPU and
    torch sees one (both sides then on the same GPU), else "cpu". Imports torch."""
    import jax
    import torch

    return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def describe_machine(info: Mapping[str, Any]) -> str:
    """One line, e.g. 'AMD EPYC, 2/2 cores, 23.4 GiB; jax 0.10.2 cpu (cpu x8)'."""
    v = info.get("versions", {})
    return (
        f"{info['cpu_model']}, {info['cpu_usable']}/{info['cpu_count']} cores, "
        f"{info['memory_gib']} GiB; jax {v.get('jax')} {info['backend']} "
        f"({info['device_kind']} x{info['device_count']})"
    )


# --------------------------------------------------------------------------- #
# Timing and the matmul peak
# --------------------------------------------------------------------------- #
def time_fn(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1) -> dict[str, float]:
    """Wall seconds of ``fn()`` (which must block until its result is ready).

    Returns {"best_s", "median_s", "repeats"}; the best is the least noisy on a
    shared machine, the median is what a user sees.
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1.")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"best_s": min(times), "median_s": statistics.median(times), "repeats": repeats}


def time_interleaved(
    fns: Sequence[Callable[[], Any]], *, repeats: int, warmup: int = 0, calls_per_turn: int = 1
) -> list[dict[str, float]]:
    """Wall seconds of several functions called in turn, `repeats` rounds (after
    `warmup` calls each), so all see the same machine load. One {"best_s",
    "median_s"} per function, in order.

    With `calls_per_turn` k > 1 each turn calls its function k times in a row and times
    only the last call; the first call's seconds come back too ("first_best_s",
    "first_median_s"). Two frameworks timed in turn leave each other a process to
    re-warm (freed pools, sleeping worker threads), which the first call after the other
    framework pays, as neither framework's user does."""
    if calls_per_turn < 1:
        raise ValueError(f"calls_per_turn={calls_per_turn} must be >= 1")
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    first: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts, fs in zip(fns, times, first):
            for k in range(calls_per_turn):
                t0 = time.perf_counter()
                fn()
                (ts if k == calls_per_turn - 1 else fs).append(time.perf_counter() - t0)
    out = [{"best_s": min(ts), "median_s": statistics.median(ts)} for ts in times]
    if calls_per_turn > 1:
        for o, fs in zip(out, first):
            o |= {"first_best_s": min(fs), "first_median_s": statistics.median(fs)}
    return out


def matmul_peak(
    n: int | None = None, *, dtype: str = "float32", repeats: int = 5, calls: int | None = None
) -> dict[str, Any]:
    """Measured dense matmul throughput of the default device: jitted ``a @ b``, a, b [n, n].

    Args:
      n: matrix size; default 2048 on CPU, 8192 on accelerators (enough work
        per call that dispatch does not count).
      dtype: "float32" or "bfloat16".
      repeats: timed rounds; the best round counts.
      calls: matmuls per round, dispatched back to back and waited on once, so
        the launch latency overlaps; default 1 on CPU, 10 on accelerators.
    Returns:
      {"flops_per_s", "gflops_per_s", "n", "dtype", "best_s" (per matmul),
       "backend", "device_kind", "precision"}. On GPUs, float32 dots run at
      JAX's default precision (TF32 where the hardware has it); "precision"
      records the setting so that numbers are read with it.
    """
    import jax
    import jax.numpy as jnp

    backend = jax.default_backend()
    accel = backend != "cpu"
    n = int(n or (8192 if accel else 2048))
    calls = int(calls or (10 if accel else 1))
    if n < 1 or calls < 1:
        raise ValueError(f"matmul_peak: n={n} and calls={calls} must be >= 1.")
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), jnp.dtype(dtype))
    b = jax.random.normal(kb, (n, n), jnp.dtype(dtype))
    mm = jax.jit(jnp.matmul)

    def round_() -> None:
        out = [mm(a, b) for _ in range(calls)]
        jax.block_until_ready(out)

    t = time_fn(round_, repeats=repeats, warmup=1)
    per_call = t["best_s"] / calls
    flops = 2.0 * n**3 / per_call
    dev = jax.devices()[0]
    return {
        "flops_per_s": flops,
        "gflops_per_s": round(flops / 1e9, 2),
        "n": n,
        "dtype": dtype,
        "best_s": per_call,
        "calls_per_round": calls,
        "repeats": repeats,
        "backend": backend,
        "device_kind": getattr(dev, "device_kind", str(dev)),
        "precision": str(jax.config.jax_default_matmul_precision or "default"),
    }


# --------------------------------------------------------------------------- #
# Output: JSON and markdown
# --------------------------------------------------------------------------- #
def to_jsonable(obj: Any) -> Any:
    """NumPy / JAX scalars and arrays, tuples, dataclass-free objects -> JSON types.

    Non-finite floats become None (strict JSON readers reject NaN).
    """
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "tolist"):  # numpy / jax arrays and scalars
        return to_jsonable(obj.tolist())
    return str(obj)


def write_json(path: str, obj: Any) -> str:
    """Writes ``obj`` (made JSON-able) to ``path`` atomically; returns the path."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(to_jsonable(obj), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def write_text(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    os.replace(tmp, path)
    return path


def format_value(v: Any) -> str:
    """Compact cell text: 4 significant digits, thousands separators from 1e4, exponent past 1e6."""
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
            return f"{v:.3e}"
        text = f"{v:.4g}"
        # 9999.7 rounds up to 4 digits as "1e+04": the separator form from there.
        return f"{v:,.0f}" if abs(v) >= 1e4 or "e" in text else text
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 1e4 else str(v)
    if isinstance(v, (list, tuple)):
        return ", ".join(format_value(x) for x in v)
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """GitHub markdown table of ``rows`` (dicts).

    Columns default to the keys in first-seen order.
    """
    if not rows:
        return "_(no rows)_"
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(format_value(r.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def text_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Fixed-width plain-text table for the terminal."""
    if not rows:
        return "(no rows)"
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[format_value(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    fmt = lambda row: "  ".join(x.rjust(w) for x, w in zip(row, widths))  # noqa: E731
    return "\n".join([fmt(list(columns)), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells])


def result_to_markdown(result: Mapping[str, Any]) -> str:
    """Generic rendering of one benchmark's result dict.

    Scalars go into a key/value list; each list of dicts (e.g. "results")
    becomes a table; nested dicts are rendered the same way under a heading.
    """
    scalars = {
        k: v
        for k, v in result.items()
        if not isinstance(v, (Mapping, list, tuple))
        or (isinstance(v, (list, tuple)) and not any(isinstance(x, Mapping) for x in v))
    }
    parts = []
    if scalars:
        parts.append(markdown_table([{"field": k, "value": v} for k, v in scalars.items()]))
    for k, v in result.items():
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, Mapping) for x in v):
            parts.append(f"**{k}**\n\n" + markdown_table(v))
        elif isinstance(v, Mapping):
            parts.append(f"**{k}**\n\n" + result_to_markdown(v))
    return "\n\n".join(parts)


def other_ends(ends: Sequence[str]) -> str:
    """How the runs of a probe's row ended, besides "finished": the distinct ends,
    sorted and comma-joined, or "-" when every run finished."""
    return ", ".join(sorted({e for e in ends if e != "finished"}) or ["-"])


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def command_line() -> str:
    """The command as typed (``python -m benchmarks.run_all --quick``), not the script
    path; arguments with spaces are shell-quoted, so the line runs again as it stands."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    return shlex.join(["python", *argv[1:]])


def publish(res: dict[str, Any], out: str, render: Callable[[dict], str]) -> None:
    """Stamps a finished comparison with the machine, the command and the time, prints
    `render(res)` (its table) and writes the JSON to `out`, naming the file."""
    res["machine"] = machine_info()
    res["command"], res["measured_at"] = command_line(), now_iso()
    print(render(res))
    print(f"wrote {write_json(out, res)}")


def check_out(parser: argparse.ArgumentParser, path: str, flag: str, *, is_dir: bool) -> None:
    """`parser.error` (one line, exit 2) when the output `path` cannot be written, before
    the benchmark runs (`gdpo_jax.train.paths.check_output`)."""
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.train.paths import check_output

    try:
        check_output(path, flag, is_dir=is_dir)
    except ConfigError as e:
        parser.error(str(e))


def quick_out_main(
    doc: str,
    run: Callable[..., dict],
    render: Callable[[dict], str],
    default_out: str,
    quick_help: str = "Fewer repeats.",
) -> None:
    """The command line of a benchmark whose only options are --quick and --out:
    runs `run(quick=...)`, prints `render(result)` and writes the result's JSON."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=default_out, help="JSON output path.")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    args = parser.parse_args()
    check_out(parser, args.out, "--out", is_dir=False)
    result = run(quick=args.quick)
    print(render(result))
    print(f"wrote {write_json(args.out, result)}")


def compiled_with(module: Any, name: str, value: Any, fn: Any, *args: Any) -> tuple[Any, str]:
    """(`fn.lower(*args).compile()`, the lowered program's text) with `module.<name>` set
    to `value` while `fn` (jitted) is traced, then restored: two forms of one program,
    compiled in one process and timed in turn, for a library constant read at trace
    time. JAX's caches are cleared before and after, so that no trace cached under the
    other setting (a `lax.cond` branch's, say) serves this one."""
    import jax

    saved = getattr(module, name)
    setattr(module, name, value)
    jax.clear_caches()
    try:
        lowered = fn.lower(*args)
        return lowered.compile(), lowered.as_text()
    finally:
        setattr(module, name, saved)
        jax.clear_caches()


def scratch_dir(prefix: str) -> str:
    """A fresh temporary directory, removed when this process exits: for a trainer's
    workdir or a checkpoint a benchmark builds and hands on (a `with` block cannot hold
    them), so that no run leaves directories behind in the system's temp folder."""
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def cpu_label(machine: dict[str, Any]) -> str:
    """How a table's footer names the machine that ran it, from `machine_info()`'s
    fields: "<CPU model> (<vector ISA>), <usable> cores" ("?" for a missing one)."""
    model, usable = machine.get("cpu_model", "?"), machine.get("cpu_usable", "?")
    return f"{model} ({machine.get('cpu_isa', '')}), {usable} cores"


def run_child(
    module: str, args: Sequence[str], *, hugetlb: bool = True, tree: str | None = None
) -> dict[str, Any]:
    """The JSON that ``python -m <module> --_child <file> <args>`` writes to <file>, run
    in a fresh process: glibc's huge-page malloc tunable on (`hugetlb`, as bench_rl
    runs) or off, only ever from a process's start (gdpo_jax/hostenv.py), and
    gdpo_jax's own relaunch for it off. With `tree` (another checkout), this
    repository's file of `module` runs as a script there (cwd and PYTHONPATH), so
    its imports are that tree's. A failed child raises with its stderr's tail."""
    import importlib.util
    import subprocess
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env["GDPO_JAX_NO_RELAUNCH"] = "1"
    if hugetlb:
        from gdpo_jax.hostenv import cpu_tunables_env

        env = cpu_tunables_env(env)
    run = ["-m", module]
    if tree is not None:
        env["PYTHONPATH"] = tree
        run = [importlib.util.find_spec(module).origin]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, *run, "--_child", out, *args]
        proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{module} process failed:\n{proc.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)
