"""Whether a benchmark had the machine to itself: the CPU time other processes used
while it ran, the time the hypervisor stole, the load average, and the kernel's
huge-page faults, fallbacks to small pages and compaction stalls in between.

`host_counters()` reads them (Linux's /proc; None elsewhere) and
`host_activity(before, after)` compares two readings taken around a run, in the
process that waited for it. bench_rl records one per round and side, run_all one per
benchmark. `benchmarks.common` re-exports them, with LOADED_FRAC and VMSTAT_KEYS.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["LOADED_FRAC", "VMSTAT_KEYS", "host_activity", "host_counters"]

# Above this share of the cores' time used by other processes while a benchmark ran,
# its figures count as measured on a loaded machine (run_all's summary marks them ‡).
LOADED_FRAC = 0.05


# The kernel's counts (/proc/vmstat) of transparent huge-page faults served, those that
# fell back to 4 KiB pages, and allocations that stalled to compact memory first. The
# huge-page malloc tunable (gdpo_jax/hostenv.py) asks for huge pages; with the kernel's
# THP defrag at "madvise" a fault that finds none compacts memory in line, then falls back.
VMSTAT_KEYS = {
    "thp_fault_alloc": "huge_page_faults",
    "thp_fault_fallback": "huge_page_fallbacks",
    "compact_stall": "compaction_stalls",
}


def _vmstat(path: str) -> dict[str, int] | None:
    """VMSTAT_KEYS' counters from `path` (None: unreadable, or a key missing)."""
    try:
        with open(path) as f:
            fields = dict(line.split()[:2] for line in f if line.strip())
        return {k: int(fields[k]) for k in VMSTAT_KEYS}
    except (OSError, ValueError, KeyError):
        return None


def host_counters(stat: str = "/proc/stat", vmstat: str = "/proc/vmstat") -> dict[str, Any]:
    """What `host_activity` compares: the machine's busy and stolen CPU seconds since
    boot (`stat`'s first line; None off Linux), this process's CPU seconds with its
    waited-for descendants', the load average, the kernel's huge-page and compaction
    counts (`vmstat`, VMSTAT_KEYS; None off Linux) and a monotonic clock."""
    busy = steal = None
    try:
        with open(stat) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
        # user nice system idle iowait irq softirq steal ...: guest time is in user's.
        busy = (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / tick
        steal = fields[7] / tick if len(fields) > 7 else 0.0
    except (OSError, ValueError, IndexError):
        pass
    own = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        own += r.ru_utime + r.ru_stime
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {
        "t": time.monotonic(),
        "busy_s": busy,
        "steal_s": steal,
        "own_s": own,
        "load": load,
        "vm": _vmstat(vmstat),
    }


def host_activity(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """Whether the machine was shared while a benchmark ran, from two `host_counters`
    taken around it in the process that waited for it: CPU seconds other processes
    used (the machine's busy time minus ours and our descendants'), as a fraction of
    the cores' time, CPU seconds the hypervisor stole, and the load average at the
    start. A benchmark whose `other_cpu_frac` is more than a few percent ran beside
    other work: its ratios are not comparable with a quiet run's. Also the machine's
    huge-page faults, fallbacks to small pages and compaction stalls in between
    (VMSTAT_KEYS' names; None where unread): fallbacks or stalls mean a side that
    asks for huge pages did not get them all, or waited for them."""
    wall = after["t"] - before["t"]
    out: dict[str, Any] = {"wall_s": wall, "load_avg_start": before["load"]}
    vm0, vm1 = before.get("vm"), after.get("vm")
    for key, name in VMSTAT_KEYS.items():
        out[name] = vm1[key] - vm0[key] if vm0 and vm1 else None
    if before["busy_s"] is None or after["busy_s"] is None:
        return out | {"other_cpu_s": None, "other_cpu_frac": None, "steal_s": None}
    other = max((after["busy_s"] - before["busy_s"]) - (after["own_s"] - before["own_s"]), 0.0)
    cores = os.cpu_count() or 1
    return out | {
        "other_cpu_s": other,
        # At most all the cores: /proc/stat counts 10 ms jiffies, so a window of a few
        # milliseconds could read as many times the machine.
        "other_cpu_frac": min(other / (wall * cores), 1.0) if wall > 0 else None,
        "steal_s": after["steal_s"] - before["steal_s"],
    }
