"""Sandbox for untrusted generated programs (code task rewards).

One program = one sandbox process (`_sandbox_driver.py`), started with an
empty environment and a fresh working directory; each test case runs in a
child of it under rlimits (CPU, address space, processes, file size, open
files, no core) and a wall-clock deadline. What else holds depends on what the
machine allows; `isolation()` probes it once per process and records it:

  mode          who       network  pid ns  private /tmp  other uid  fork bomb bound by
  "namespaces"  root      none     yes     yes           yes        per-run uid + RLIMIT_NPROC
  "userns"      any user  none     yes     yes           no         RLIMIT_NPROC (ns-local count)
  "setuid"      root      host     no      no            yes        per-run uid + RLIMIT_NPROC
  "rlimits"     any user  host     no      no            no         RLIMIT_NPROC (all the user's)

"namespaces" = `unshare --mount --net --pid --ipc --uts --fork --mount-proc
--kill-child`; the test process drops to a uid no one else uses (one per
concurrent run), because root ignores RLIMIT_NPROC and may write anywhere.
Killing the namespace's first process ends every process inside it.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

_DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_driver.py")
_NS_FLAGS = [
    "--mount",
    "--net",
    "--pid",
    "--ipc",
    "--uts",
    "--fork",
    "--mount-proc",
    "--kill-child",
]
MODES = ("namespaces", "userns", "setuid", "rlimits")

# Imported once in the sandbox before forking test processes: cheaper than an
# import per case, and needed where the stdlib is not readable by the test uid.
DEFAULT_PRELOAD = (
    "math",
    "cmath",
    "heapq",
    "collections",
    "itertools",
    "functools",
    "bisect",
    "string",
    "re",
    "random",
    "decimal",
    "fractions",
    "statistics",
    "typing",
    "copy",
    "operator",
    "array",
    "datetime",
    "calendar",
    "dataclasses",
    "enum",
    "queue",
    "textwrap",
    "unicodedata",
)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits per test case (`cpu_s`, `wall_s`, `memory_mb`, ...) and per program.

    total_wall_s: whole program (all cases + start-up); None = derived as
    2 s + n_cases * (wall_s + 0.25).
    """

    cpu_s: float = 2.0
    wall_s: float = 4.0
    memory_mb: int = 512
    nproc: int = 8
    fsize_mb: int = 4
    nofile: int = 64
    output_bytes: int = 1 << 16
    tmpfs_mb: int = 64
    total_wall_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Isolation:
    mode: str
    network_isolated: bool
    pid_namespace: bool
    private_tmp: bool
    uid_drop: bool
    note: str = ""


@dataclasses.dataclass
class CaseResult:
    status: str  # ok|runtime_error|timeout|memory_error|output_limit|killed|sandbox_error
    stdout: str = ""
    stderr: str = ""
    value: Any = None  # call mode: the JSON-decoded return value
    time_s: float = 0.0
    truncated: bool = False


@dataclasses.dataclass
class ProgramResult:
    cases: list[CaseResult]
    compile_error: str | None = None
    sandbox_error: str | None = None
    isolation: str = ""
    wall_s: float = 0.0

    @property
    def has_error(self) -> bool:
        """Compile or runtime error (a timeout alone is not a bug)."""
        bad = {"runtime_error", "memory_error", "output_limit", "killed"}
        return self.compile_error is not None or any(c.status in bad for c in self.cases)


def _probe(cmd: list[str]) -> bool:
    try:
        return (
            subprocess.run(
                cmd,
                env={},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def _build(mode: str, root: bool) -> Isolation:
    if mode == "namespaces":
        return Isolation(mode, True, True, True, True)
    if mode == "userns":
        return Isolation(
            mode,
            True,
            True,
            True,
            False,
            "test process keeps the caller's uid: it can write what the caller can",
        )
    if mode == "setuid":
        return Isolation(
            mode,
            False,
            False,
            False,
            True,
            "no network isolation; world-writable dirs (/tmp) are writable",
        )
    return Isolation(
        "rlimits",
        False,
        False,
        False,
        False,
        "rlimits only: network, /tmp and the caller's files are reachable",
    )


@functools.cache
def isolation(mode: str = "auto") -> Isolation:
    """The strongest isolation this machine allows (probed once), or `mode` if it works."""
    if mode not in ("auto",) + MODES:
        raise ValueError(f"sandbox isolation mode must be 'auto' or one of {MODES}, got {mode!r}")
    root = os.geteuid() == 0
    unshare = shutil.which("unshare")
    avail = {"rlimits": True, "setuid": root}
    if unshare:
        avail["namespaces"] = root and _probe([unshare, *_NS_FLAGS, "true"])
        avail["userns"] = _probe([unshare, "--user", "--map-root-user", *_NS_FLAGS, "true"])
    if mode == "auto":
        mode = next(m for m in MODES if avail.get(m))
    elif not avail.get(mode):
        raise RuntimeError(
            f"sandbox isolation {mode!r} is not available on this machine "
            f"(available: {[m for m in MODES if avail.get(m)]})"
        )
    return _build(mode, root)


class _UidPool:
    """Distinct unprivileged uids for concurrent runs of this process.

    A fresh uid per run makes RLIMIT_NPROC a per-run bound (the kernel counts
    processes per uid) and lets the sandbox kill exactly the run's processes.
    The base depends on the pid so that two trainers rarely share uids.
    """

    def __init__(self, size: int = 64):
        self._base = 200_000 + (os.getpid() % 4000) * size
        self._free = list(range(size))
        self._cv = threading.Condition()

    def acquire(self) -> int:
        with self._cv:
            while not self._free:
                self._cv.wait()
            return self._base + self._free.pop()

    def release(self, uid: int) -> None:
        with self._cv:
            self._free.append(uid - self._base)
            self._cv.notify()


_UIDS = _UidPool()
_BASE_LOCK = threading.Lock()
_BASE_DIR: list[str] = []


def _base_dir() -> str:
    # Root-owned, 0711: an unprivileged test uid can neither list it nor
    # create files beside its own working directory.
    with _BASE_LOCK:
        if not _BASE_DIR:
            d = tempfile.mkdtemp(prefix="gdpo_sandbox_")
            os.chmod(d, 0o711)
            _BASE_DIR.append(d)
            atexit.register(shutil.rmtree, d, True)
        return _BASE_DIR[0]


def _keep_paths() -> list[str]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    return sorted(paths)


def _kill_uid_outside(uid: int) -> None:
    """Kill leftovers of `uid` from outside (setuid mode: no pid namespace)."""
    for _ in range(50):
        found = False
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if os.stat(f"/proc/{pid}").st_uid == uid:
                        os.kill(int(pid), signal.SIGKILL)
                        found = True
                except OSError:
                    pass
        if not found:
            return
        time.sleep(0.01)


def run_program(
    source: str,
    inputs: Sequence[Any],
    *,
    fn_name: str | None = None,
    limits: SandboxLimits = SandboxLimits(),
    isolation_mode: str = "auto",
    preload: Sequence[str] = DEFAULT_PRELOAD,
) -> ProgramResult:
    """Run `source` once per input, in the sandbox.

    inputs: stdin mode (fn_name None): one str per case (a list of lines is
      joined with newlines); call mode: one list of positional args per case,
      for `fn_name` defined at top level or as a method of class `Solution`.
    Returns per-case status, captured stdout (capped at limits.output_bytes),
    stderr tail and, in call mode, the JSON round-tripped return value.
    """
    iso = isolation(isolation_mode)
    t0 = time.monotonic()
    uid = _UIDS.acquire() if iso.uid_drop else None
    jobdir = tempfile.mkdtemp(dir=_base_dir())
    try:
        job = {
            "source": source,
            "mode": "call" if fn_name else "stdin",
            "fn_name": fn_name,
            "inputs": list(inputs),
            "limits": dataclasses.asdict(limits),
            "uid": uid,
            "gid": uid,
            "private_mounts": iso.private_tmp,
            "keep_paths": _keep_paths(),
            "nproc_base": 0,
            "workdir": None,
            "iodir": None,
            "preload": list(preload),
        }
        if not iso.private_tmp:
            work, io = os.path.join(jobdir, "work"), os.path.join(jobdir, "io")
            os.mkdir(work, 0o700)
            os.mkdir(io, 0o700)
            if uid is not None:
                os.chmod(jobdir, 0o711)
            job["workdir"], job["iodir"] = work, io
        job_path = os.path.join(jobdir, "job.json")
        with open(os.open(job_path, os.O_WRONLY | os.O_CREAT, 0o600), "w", encoding="utf-8") as f:
            json.dump(job, f)
        cmd = [sys.executable, "-I", "-B", _DRIVER, job_path]
        if iso.mode == "namespaces":
            cmd = [shutil.which("unshare"), *_NS_FLAGS, *cmd]
        elif iso.mode == "userns":
            cmd = [shutil.which("unshare"), "--user", "--map-root-user", *_NS_FLAGS, *cmd]
        total = limits.total_wall_s or 2.0 + len(job["inputs"]) * (limits.wall_s + 0.25)
        out, err, timed_out = _spawn(cmd, jobdir, total)
        if uid is not None and not iso.pid_namespace:
            _kill_uid_outside(uid)
    finally:
        shutil.rmtree(jobdir, ignore_errors=True)
        if uid is not None:
            _UIDS.release(uid)
    wall = time.monotonic() - t0
    n = len(job["inputs"])
    if timed_out:
        return ProgramResult(
            [CaseResult("timeout") for _ in range(n)],
            None,
            f"program exceeded its total wall time {total:.1f}s",
            iso.mode,
            wall,
        )
    try:
        res = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return ProgramResult(
            [CaseResult("sandbox_error") for _ in range(n)],
            None,
            f"sandbox driver gave no result: {err[-500:]!r}",
            iso.mode,
            wall,
        )
    cases = [CaseResult(**c) for c in res["cases"]]
    if res["setup_error"]:
        cases = [CaseResult("sandbox_error") for _ in range(n)]
    elif res["compile_error"]:
        cases = [CaseResult("runtime_error", stderr=res["compile_error"]) for _ in range(n)]
    return ProgramResult(cases, res["compile_error"], res["setup_error"], iso.mode, wall)


def _spawn(cmd: list[str], cwd: str, timeout: float) -> tuple[str, str, bool]:
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), False
    except subprocess.TimeoutExpired:
        # The session holds unshare and the namespace's first process; killing
        # that one ends every process of the namespace.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        return "", "", True
