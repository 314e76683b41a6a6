"""Per-process ranges of unprivileged uids for the code sandbox's test processes.

A fresh uid per run makes RLIMIT_NPROC a per-run bound (the kernel counts
processes per uid) and lets the sandbox kill exactly the run's processes; two
processes (or containers) must therefore never share a range.
"""

from __future__ import annotations

import hashlib
import os
import threading

# The host's (initial) pid namespace: its inode is fixed (PROC_PID_INIT_INO).
_HOST_PID_NS = 0xEFFFFFFC
_UID_SLOTS = 1 << 24


def _pid_namespace() -> int:
    """The inode of this process's pid namespace (the host's where /proc says none)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return _HOST_PID_NS


def uid_base(pid: int, pid_ns: int, size: int = 64) -> int:
    """The first uid of the range a process of `pid` in pid namespace `pid_ns` owns."""
    offset = 0
    if pid_ns != _HOST_PID_NS:
        digest = hashlib.blake2b(pid_ns.to_bytes(8, "little"), digest_size=4).digest()
        offset = int.from_bytes(digest, "little")
    return 200_000 + ((pid + offset) % _UID_SLOTS) * size


class _UidPool:
    """Distinct unprivileged uids for concurrent runs of this process.

    A fresh uid per run makes RLIMIT_NPROC a per-run bound (the kernel counts
    processes per uid) and lets the sandbox kill exactly the run's processes.

    Each process owns the range 200000 + slot * size, slot = (pid + offset) mod
    2**24: live processes of one pid namespace have distinct pids (< 2**22, the
    kernel's PID_MAX_LIMIT), so no two share a uid (the former `pid % 4000` made
    pids 4000 apart collide). The offset is 0 in the host's pid namespace and a
    hash of the namespace otherwise: trainers in two containers that share the
    host's uids (two pid-1 processes) took the same range, so one's programs
    counted against the other's RLIMIT_NPROC (and the uid kill could reach them);
    now they collide only if their offsets differ by their pid difference. The
    highest uid is 200000 + 2**30 - 1 = 1,073,941,823, under 2**31 - 1 (tools that
    read uids as signed 32-bit). It may overlap subordinate uids that
    /etc/subuid hands to containers on this host. A process forked after import
    (not the reward pool's workers, spawned: they import it afresh) takes its own range
    (`register_at_fork`).
    """

    def __init__(self, size: int = 64):
        self._size = size
        self._rebase()

    def _rebase(self) -> None:
        self._base = uid_base(os.getpid(), _pid_namespace(), self._size)
        self._free = list(range(self._size))
        self._cv = threading.Condition()  # a lock held by another thread at fork is lost

    def acquire(self) -> int:
        with self._cv:
            while not self._free:
                self._cv.wait()
            return self._base + self._free.pop()

    def release(self, uid: int) -> None:
        with self._cv:
            self._free.append(uid - self._base)
            self._cv.notify()
