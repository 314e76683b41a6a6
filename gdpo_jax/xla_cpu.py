"""XLA:CPU collectives over several devices: the ordered scheduler, set before JAX starts.

Why: in jaxlib 0.10.2, XLA:CPU's concurrency-optimized scheduler lets the
devices' threads of one program reach its collectives in different orders. A
program over several CPU devices (`--xla_force_host_platform_device_count`, or
one device in each of several processes joined by gloo) then deadlocks sooner or
later: the devices wait in different collectives' rendezvous and the process
aborts after 40 s, or with gloo across processes one side receives another
collective's bytes ("Is there a distributed collective mismatch in your code?")
or both wait for ever. The fused RL step, freshly compiled on an idle machine,
stopped so in 5 of 6 probe runs of 400 executions, after 43-333 of them; with
`--xla_cpu_enable_concurrency_optimized_scheduler=false` all 6 finished
(`python -m benchmarks.probe_cpu_collectives_repeat`, the counts in docs/limits.md).
Programs loaded from the persistent cache are more exposed still (`compile_cache.py`).

So `import gdpo_jax` adds that flag to XLA_FLAGS when the flags give the host
platform several devices, and `train.distributed.initialize` adds it before a
multi-process CPU run (`JAX_PLATFORMS=cpu`) joins its cluster, both only while no JAX backend has
started (XLA parses XLA_FLAGS once, when the first backend starts). A setting of
the flag already in XLA_FLAGS, either way, is kept. GPU and TPU programs and a
single CPU device are not affected; an accelerator's XLA ignores the CPU flag.

The ordered scheduler orders one program's collectives; it does not stop a second
way to deadlock. XLA:CPU runs the ready thunks of a process's CPU devices on one
intra-op thread pool, and a collective blocks its thread until every device arrives.
The pool has one thread per device (or per core, if more). When the devices have
several collectives in flight (independent all-gathers of one program, or the next
program's, dispatched while this one runs), the waiting threads can take the whole
pool while one device's next thunk waits for a thread: seven devices wait in an
all-gather for an eighth that never runs. Four Python threads each running an
8-device program of 8 independent all-gathers aborted so in 3 of 3 runs on XLA's
pool and finished on 16-64 threads (`python -m benchmarks.probe_cpu_collectives_pool`,
docs/limits.md); the suite's 8-device sampler decode, which aborted in two clean-clone
runs, had a pool thread waiting in an all-gather. So `import gdpo_jax` also sizes the
pool at `POOL_THREADS_PER_DEVICE` threads per CPU device through `PJRT_NPROC` (read
when the CPU client starts), under the same conditions, unless `PJRT_NPROC` or
`NPROC` is set. Once the CPU client has started, the setting leaves os.environ
again (`pool_setting_for_this_process_only`): the processes a run starts size
their own pools.

A leaf: imports neither JAX nor anything from gdpo_jax at import, so the
package's `__init__` can call it before JAX is imported.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import MutableMapping

__all__ = [
    "ORDERED_SCHEDULER",
    "POOL_ENV",
    "POOL_THREADS_PER_DEVICE",
    "SCHEDULER_FLAG",
    "add_ordered_scheduler",
    "host_device_count",
    "pool_setting_for_this_process_only",
    "pool_threads",
    "use_collective_pool",
    "use_ordered_scheduler",
]

SCHEDULER_FLAG = "xla_cpu_enable_concurrency_optimized_scheduler"
ORDERED_SCHEDULER = f"--{SCHEDULER_FLAG}=false"
_COUNT = re.compile(r"--xla_force_host_platform_device_count=(\d+)")
# XLA:CPU's intra-op pool takes max(PJRT_NPROC, devices) threads (PJRT_NPROC, else
# NPROC, else the cores). Idle ones sleep; a larger pool's cost on busy devices did
# not resolve from the spread between runs (docs/limits.md).
POOL_ENV = "PJRT_NPROC"
POOL_THREADS_PER_DEVICE = 8


def host_device_count(xla_flags: str, environ: MutableMapping[str, str] | None = None) -> int:
    """How many CPU devices the flags (the last count wins, as XLA parses them) or
    `JAX_NUM_CPU_DEVICES` give the host platform; 1 when neither sets it."""
    env = os.environ if environ is None else environ
    counts = [int(n) for n in _COUNT.findall(xla_flags)]
    if counts:
        return counts[-1]
    try:
        return int(env.get("JAX_NUM_CPU_DEVICES", "") or 1)
    except ValueError:
        return 1


def add_ordered_scheduler(xla_flags: str) -> str:
    """`xla_flags` with `ORDERED_SCHEDULER` appended, unless they already set the
    scheduler flag (to either value: a choice made there is kept)."""
    if f"--{SCHEDULER_FLAG}" in xla_flags:
        return xla_flags
    return f"{xla_flags} {ORDERED_SCHEDULER}".strip()


def _backend_started() -> bool:
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(bridge is not None and getattr(bridge, "_backends", None))


def use_ordered_scheduler(
    *, several_processes: bool = False, environ: MutableMapping[str, str] | None = None
) -> bool:
    """Adds `ORDERED_SCHEDULER` to `environ["XLA_FLAGS"]` (default os.environ) when
    CPU programs will span several devices: the flags give the host platform more
    than one, or `several_processes` (a CPU run joining a cluster). Nothing when a
    backend has started (XLA has read the flags) or the flags set the scheduler.
    Returns whether it added the flag."""
    env = os.environ if environ is None else environ
    flags = env.get("XLA_FLAGS", "")
    if _backend_started() or not (several_processes or host_device_count(flags, env) > 1):
        return False
    new = add_ordered_scheduler(flags)
    if new == flags:
        return False
    env["XLA_FLAGS"] = new
    return True


def pool_threads(devices: int, cores: int) -> int:
    """Threads for XLA:CPU's intra-op pool over `devices` CPU devices: enough that
    collectives waiting on every thread need `POOL_THREADS_PER_DEVICE` of them in
    flight per device, and never fewer than the cores."""
    return max(cores, POOL_THREADS_PER_DEVICE * devices)


def use_collective_pool(environ: MutableMapping[str, str] | None = None) -> bool:
    """Sets `environ[POOL_ENV]` (default os.environ) to `pool_threads` when the flags
    give the host platform several devices. Nothing when a backend has started (the
    CPU client has its pool), or `PJRT_NPROC` or `NPROC` is set (a choice made
    there is kept). Returns whether it set it."""
    env = os.environ if environ is None else environ
    devices = host_device_count(env.get("XLA_FLAGS", ""), env)
    if _backend_started() or devices < 2 or env.get(POOL_ENV) or env.get("NPROC"):
        return False
    env[POOL_ENV] = str(pool_threads(devices, os.cpu_count() or 1))
    return True


def pool_setting_for_this_process_only() -> None:
    """Takes the `PJRT_NPROC` that `use_collective_pool` set out of os.environ once
    this process's CPU client has started (it read it then), so the processes this
    one starts choose for their own devices: a one-device child (a sandboxed
    program, a benchmark's measuring process) would otherwise get this process's
    pool, and a child that names its own setting is not overridden by ours. Needs
    JAX imported; registers a backend-initialization hook (private, jax 0.10.2).
    A value changed since (someone else's choice) is kept."""
    ours = os.environ.get(POOL_ENV)
    if ours is None:
        return
    from jax._src import xla_bridge

    def forget(backend: object) -> None:
        if getattr(backend, "platform", None) == "cpu" and os.environ.get(POOL_ENV) == ours:
            del os.environ[POOL_ENV]

    xla_bridge.register_backend_initialization_hook(forget)
