r"""Do collectives waiting on XLA:CPU's thread pool starve it? Deadlock counts and cost.

XLA:CPU runs the ready thunks of a process's CPU devices on one intra-op pool, and a
collective blocks its thread until every device arrives (gdpo_jax/xla_cpu.py). With
several collectives in flight per device the waiting threads can take the whole pool.
This probe makes many of them: `--threads` Python threads each run, `--iters` times,
one program over 8 CPU devices whose 8 weights are all-gathered independently (as
FSDP gathers a layer's weights), under the ordered scheduler, in a fresh process per
run. For each pool setting it records how each run ended: "finished", "aborted"
(XLA's abort after `--collective-timeout` s in a rendezvous) or "hung" (killed at
`--timeout`), and, in one more process each, the pool's threads and the median time of
a one-device and an 8-device matmul chain (what a bigger pool costs).

    python -m benchmarks.probe_cpu_collectives_pool [--runs 3] [--threads 4] \
        [--iters 40] [--out runs/bench/cpu_collectives_pool.json]

About 10 minutes at the defaults on a 2-core machine; needs it otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import common
from gdpo_jax.xla_cpu import POOL_ENV, pool_threads

DEFAULT_OUT = "runs/bench/cpu_collectives_pool.json"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICES = 8
# PJRT_NPROC for each setting: "1" gives XLA's smallest pool, one thread per device
# (its default on a machine of at most 8 cores); None leaves it to `import gdpo_jax`.
SETTINGS = {
    "one thread per device (XLA's)": "1",
    "2 threads per device": str(2 * DEVICES),
    "4 threads per device": str(4 * DEVICES),
    "gdpo_jax's pool": None,
}


def pool_size() -> int:
    """Threads of XLA:CPU's intra-op pool in this process (named tf_XLAEigen)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            names.append(f.read().strip())
    return sum(n == "tf_XLAEigen" for n in names)


def _programs() -> tuple[Callable, Callable, Callable, tuple]:
    """(gathers, one_device, eight_devices, inputs): jitted programs and their inputs
    (x f32[512, 1024] and 8 weights f32[1024, 1024], rows over the 8 devices; x1
    f32[256, 1024] and w1 f32[1024, 1024] on one)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((DEVICES,), ("x",))
    rng = np.random.default_rng(0)
    gathered, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("x"))
    ws = [jax.device_put(rng.normal(size=(1024, 1024)).astype(np.float32), rows) for _ in range(8)]
    x = jax.device_put(np.ones((512, 1024), np.float32), rows)

    @jax.jit
    def gathers(x, ws):  # 8 independent all-gathers, each weight's
        return sum(jnp.tanh(x @ jax.lax.with_sharding_constraint(w, gathered) / 32) for w in ws)

    @jax.jit
    def eight_devices(x, ws):  # the same gathers, used in a chain
        for w in ws:
            x = jnp.tanh(x @ jax.lax.with_sharding_constraint(w, gathered) / 32)
        return x

    @jax.jit
    def one_device(x, w):
        for _ in range(3):
            x = jnp.tanh(x @ w / 32)
        return x

    w1 = jnp.asarray(rng.normal(size=(1024, 1024)).astype(np.float32))
    x1 = jnp.asarray(rng.normal(size=(256, 1024)).astype(np.float32))
    return gathers, one_device, eight_devices, (x, ws, x1, w1)


def worker(threads: int, iters: int) -> None:
    """Runs `gathers` `iters` times in each of `threads` Python threads; prints each
    thread's executions done."""
    import threading

    import jax

    import gdpo_jax  # noqa: F401  (the ordered scheduler; the pool unless PJRT_NPROC is set)

    gathers, _, _, (x, ws, _, _) = _programs()
    jax.block_until_ready(gathers(x, ws))
    done = [0] * threads

    def run(t: int) -> None:
        y = x
        for i in range(iters):
            y = gathers(y, ws)
            if i % 10 == 9:
                jax.block_until_ready(y)
            done[t] += 1
        jax.block_until_ready(y)

    pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    print(json.dumps({"done": done}), flush=True)


def timing_worker() -> None:
    """Prints the pool's threads and the median ms of the one- and 8-device chains."""
    import statistics

    import jax

    import gdpo_jax  # noqa: F401

    _, one_device, eight_devices, (x, ws, x1, w1) = _programs()

    def median_ms(fn: Callable, *args: Any, n: int = 20) -> float:
        jax.block_until_ready(fn(*args))
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            ts.append(time.perf_counter() - t0)
        return round(statistics.median(ts) * 1e3, 2)

    out = {
        "one_device_ms": median_ms(one_device, x1, w1),
        "eight_devices_ms": median_ms(eight_devices, x, ws),
        "pool_threads": pool_size(),
    }
    print(json.dumps(out), flush=True)


def _env(pool: str | None, collective_timeout: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.pop(POOL_ENV, None)
    env.pop("NPROC", None)
    if pool is not None:
        env[POOL_ENV] = pool
    env.update(
        JAX_PLATFORMS="cpu",
        PYTHONPATH=ROOT,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES} "
        f"--xla_cpu_collective_call_terminate_timeout_seconds={collective_timeout}",
    )
    return env


def one_run(
    pool: str | None, threads: int, iters: int, collective_timeout: int, timeout_s: float
) -> dict[str, Any]:
    """One worker process: its threads' executions done and how it ended."""
    cmd = [sys.executable, "-m", "benchmarks.probe_cpu_collectives_pool", "--worker"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [*cmd, str(threads), str(iters)],
            cwd=ROOT,
            env=_env(pool, collective_timeout),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"end": "hung", "done": None, "seconds": round(time.perf_counter() - t0, 1)}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    done = json.loads(lines[-1])["done"] if lines else None
    end = "finished" if proc.returncode == 0 and done == [iters] * threads else "aborted"
    return {"end": end, "done": done, "seconds": round(time.perf_counter() - t0, 1)}


def timing(pool: str | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.probe_cpu_collectives_pool", "--timing"]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(pool, 40), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"timing process failed:\n{proc.stderr[-3000:]}")
    return json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])


def run(
    runs: int = 3,
    threads: int = 4,
    iters: int = 40,
    collective_timeout: int = 20,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Returns a JSON-able dict: one row per pool setting."""
    rows = []
    for label, pool in SETTINGS.items():
        got = [one_run(pool, threads, iters, collective_timeout, timeout_s) for _ in range(runs)]
        rows.append(
            {
                "setting": label,
                "pjrt_nproc": pool if pool is not None else "(import gdpo_jax)",
                **timing(pool),
                "threads": threads,
                "iters": iters,
                "runs": runs,
                "finished": sum(r["end"] == "finished" for r in got),
                "ends": [r["end"] for r in got],
                "seconds": [r["seconds"] for r in got],
            }
        )
        print(common.text_table(rows[-1:]), flush=True)
    return {
        "benchmark": "cpu_collectives_pool",
        "machine": common.machine_info(),
        "command": common.command_line(),
        "measured_at": common.now_iso(),
        "devices": DEVICES,
        "pool_threads_per_gdpo_jax": pool_threads(DEVICES, os.cpu_count() or 1),
        "collective_timeout_s": collective_timeout,
        "results": rows,
    }


def format_table(results: list[dict[str, Any]]) -> str:
    """Markdown table of the result rows."""
    lines = [
        "| pool | threads | runs (Python threads x executions) | finished | how the others "
        "ended | 1-device chain ms | 8-device chain ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['setting']} | {r['pool_threads']} | {r['runs']} ({r['threads']} x "
            f"{r['iters']}) | {r['finished']} | {common.other_ends(r['ends'])} | "
            f"{r['one_device_ms']} | "
            f"{r['eight_devices_ms']} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--timing":
        timing_worker()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="Worker processes per setting.")
    parser.add_argument("--threads", type=int, default=4, help="Python threads per worker.")
    parser.add_argument("--iters", type=int, default=40, help="Executions per thread.")
    parser.add_argument(
        "--collective-timeout", type=int, default=20, help="XLA's rendezvous abort, s."
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds per worker.")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON output path.")
    args = parser.parse_args()
    common.check_out(parser, args.out, "--out", is_dir=False)  # before the run
    result = run(args.runs, args.threads, args.iters, args.collective_timeout, args.timeout)
    print(format_table(result["results"]))
    print(f"wrote {common.write_json(args.out, result)}")


if __name__ == "__main__":
    main()
