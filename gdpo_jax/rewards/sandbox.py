"""Sandbox for untrusted generated programs (code task rewards).

One program = one sandbox process (`_sandbox_driver.py`), started with an
empty environment and a fresh working directory; each test case runs in a
child of it under rlimits (CPU, address space, processes, file size, open
files, no core) and a wall-clock deadline. What else holds depends on what the
machine allows; `isolation()` probes it once per process and records it:

  mode          who       network  pid ns  own root  other uid  fork bomb bound by
  "namespaces"  root      none     yes     yes       yes        per-run uid + RLIMIT_NPROC
  "userns"      non-root  none     yes     yes       no         RLIMIT_NPROC (ns-local count)
  "setuid"      root      host     no      no        yes        per-run uid + RLIMIT_NPROC
  "rlimits"     non-root  host     no      no        no         RLIMIT_NPROC, all user's tasks

"own root": the program sees a minimal root (`_sandbox_root.minimal_root`:
the system's library trees, the interpreter and its site-packages, read-only,
and a fresh /tmp), not the host's files.

Anything weaker than "namespaces" is logged as a warning naming what it
lacks; "setuid" and "rlimits" (network reachable) are opt-in: "auto" refuses
them unless `allow_weak=True` (config: rewards.sandbox.allow_weak), and
naming one explicitly (rewards.sandbox.isolation) is that opt-in.

"namespaces" = `unshare --mount --net --pid --ipc --uts --fork --mount-proc
--kill-child`; the test process drops to a uid no one else uses (one per
concurrent run), because root ignores RLIMIT_NPROC and may write anywhere.
Killing the namespace's first process ends every process inside it.

A caller with a deadline (the RewardRunner's, through the code rewards) passes
it as `run_program(..., deadline=)`: the whole run, the driver's kill and the
collection of its results included, then ends before it, and the cases it had
no time for are "timeout"s, the program's failure. A driver whose caller is
gone (its result pipe closed) kills its case and exits.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import logging
import marshal
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

# Isolation probing lives in gdpo_jax.rewards.isolation, the uid ranges in
# gdpo_jax.rewards.uids; their names import from here too.
from gdpo_jax.rewards.isolation import (  # noqa: F401
    _NS_FLAGS,
    MODES,
    WEAK_MODES,
    Isolation,
    isolation,
)
from gdpo_jax.rewards.sandbox_dirs import base_dir as _base_dir
from gdpo_jax.rewards.uids import (  # noqa: F401
    _HOST_PID_NS,
    _pid_namespace,
    _UidPool,
    uid_base,
)

_DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_driver.py")
log = logging.getLogger("gdpo_jax.sandbox")

# Imported once in the sandbox before forking test processes: cheaper than an
# import per case, and needed where the stdlib is not readable by the test uid.
# Only those the program's source names are imported (`_named`): importing all
# of them used to be most of a program's cost (bench_sandbox's "all preloads" row).
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
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _named(source: str, modules: Sequence[str]) -> list[str]:
    """The modules whose name appears as a word anywhere in `source` (an import,
    but also a string or a comment: a superset of what the program can import
    by name, found without parsing the untrusted source in this process)."""
    words = set(_WORD.findall(source))
    return [m for m in modules if m.split(".")[0] in words]


@functools.cache
def _site_paths() -> tuple[str, ...]:
    """This interpreter's site-packages directories (once per process). The
    driver starts with -S (no `site`: it would run every .pth hook of the
    environment, ~15 ms per program) and puts these on its path itself, so a
    program can import what it could with `site` (where the test uid can read it)."""
    try:
        paths = site.getsitepackages()
    except AttributeError:  # some embedded interpreters lack it
        paths = []
    return tuple(p for p in paths if os.path.isdir(p))


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits per test case (`cpu_s`, `wall_s`, `memory_mb`, ...) and per program.

    total_wall_s: whole program (all cases + start-up); None = derived as
    2 s + n_cases * (wall_s + 0.25). A caller's `deadline` can cut it shorter.
    output_bytes: stdout kept per case (the rest is cut, `truncated`).
    value_bytes: call mode, the JSON text of the return value per case; a
      longer one fails the case as "output_limit". A value also has to fit in
      fsize_mb (the test process writes it to a file), and may nest at most 100
      lists / dicts deep (a deeper one is a "runtime_error"). Decoded, a value
      takes up to ~20x its JSON size in the caller, hence 1 MiB, not fsize_mb.
    """

    cpu_s: float = 2.0
    wall_s: float = 4.0
    memory_mb: int = 512
    nproc: int = 8
    fsize_mb: int = 4
    nofile: int = 64
    output_bytes: int = 1 << 16
    value_bytes: int = 1 << 20
    tmpfs_mb: int = 64
    total_wall_s: float | None = None


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
    # The caller's deadline, not the program's own limits, ended the run with cases
    # unrun: another call (with more time) may score the same program differently.
    cut_short: bool = False

    @property
    def has_error(self) -> bool:
        """Compile or runtime error (a timeout alone is not a bug)."""
        bad = {"runtime_error", "memory_error", "output_limit", "killed"}
        return self.compile_error is not None or any(c.status in bad for c in self.cases)


# Enter the minimal root with pivot_root (False: its fallback, move and chroot; tests).
_PIVOT_ROOT = True
# How much of a caller's remaining time run_program keeps back (at most 20% of it).
_STOP_GRACE_S = 0.5
_UIDS = _UidPool()
os.register_at_fork(after_in_child=_UIDS._rebase)


def _keep_paths() -> list[str]:
    """What the sandbox's minimal root shows of this interpreter: its prefixes (the
    standard library) and site-packages. Other `sys.path` entries (the working tree,
    PYTHONPATH) stay out: they may hold the task's data."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(_site_paths())
    return sorted(p for p in paths if os.path.isdir(p))


def _hide_paths() -> list[str]:
    """Directories the minimal root covers with an empty one where a kept tree holds
    them: this package when installed (not editable), whose sample data holds the
    code task's expected outputs."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # gdpo_jax/
    return sorted({here, os.path.realpath(here)})


@functools.cache
def self_check(mode: str = "auto", allow_weak: bool = False) -> None:
    """Run one trivial program in `mode` (once per process); a RuntimeError naming
    the sandbox's own set-up error if it does not run.

    A set-up this machine refuses (a mount, the root's entry) would otherwise make
    every program a `sandbox_error`, a NaN reward, only once training runs.
    """
    res = run_program(
        "def f():\n    return 1\n", [[]], fn_name="f", isolation_mode=mode, allow_weak=allow_weak
    )
    case = res.cases[0]
    if res.sandbox_error is not None or case.status != "ok" or case.value != 1:
        why = res.sandbox_error or f"{case.status}: {case.stderr[-300:]}"
        raise RuntimeError(
            f"sandbox: a trivial program does not run in mode {res.isolation!r} on this "
            f"machine ({why}); choose another mode with rewards.sandbox.isolation."
        )


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
    allow_weak: bool = False,
    preload: Sequence[str] = DEFAULT_PRELOAD,
    deadline: float | None = None,
) -> ProgramResult:
    """Run `source` once per input, in the sandbox.

    inputs: stdin mode (fn_name None): one str per case (a list of lines is
      joined with newlines); call mode: one list of positional args per case,
      for `fn_name` defined at top level or as a method of class `Solution`.
    Returns per-case status, captured stdout (capped at limits.output_bytes),
    stderr tail and, in call mode, the JSON round-tripped return value.
    isolation_mode / allow_weak: see `isolation`.
    preload: modules the sandbox imports before forking the test processes,
      those of them that `source` names (`_named`).
    deadline: a `time.monotonic()` time by which this call must have returned
      (a RewardRunner's deadline): the program's total wall time is cut so that
      the run, its kill and the clean-up end before it; cases left without
      time are "timeout"s (the program's failure).
    """
    iso = isolation(isolation_mode, allow_weak)
    t0 = time.monotonic()
    own = limits.total_wall_s or 2.0 + len(inputs) * (limits.wall_s + 0.25)
    total = own
    if deadline is not None:
        # Kept back for killing the driver, reading what it printed and removing
        # its directory: a few ms normally, but a loaded host may take longer.
        total = min(total, deadline - t0 - min(_STOP_GRACE_S, 0.2 * (deadline - t0)))
        if total <= 0:
            why = "no time left before the caller's deadline"
            cases = [CaseResult("timeout", stderr=why) for _ in inputs]
            return ProgramResult(cases, None, None, iso.mode, 0.0, cut_short=True)
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
            "hide_paths": _hide_paths(),
            "pivot_root": _PIVOT_ROOT,
            "nproc_base": 0,
            "workdir": None,
            "iodir": None,
            "preload": _named(source, preload),
            "sys_path": list(_site_paths()),
        }
        if not iso.private_tmp:
            work, io = os.path.join(jobdir, "work"), os.path.join(jobdir, "io")
            os.mkdir(work, 0o700)
            os.mkdir(io, 0o700)
            if uid is not None:
                os.chmod(jobdir, 0o711)
            job["workdir"], job["iodir"] = work, io
        job_path = os.path.join(jobdir, "job.marshal")
        with open(os.open(job_path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            marshal.dump(job, f)  # the driver runs on this interpreter: no json import there
        cmd = [sys.executable, "-I", "-S", "-B", _DRIVER, job_path]
        if iso.mode == "namespaces":
            cmd = [shutil.which("unshare"), *_NS_FLAGS, *cmd]
        elif iso.mode == "userns":
            cmd = [shutil.which("unshare"), "--user", "--map-root-user", *_NS_FLAGS, *cmd]
        out, err, timed_out = _spawn(cmd, jobdir, total, deadline)
        if uid is not None and not iso.pid_namespace:
            _kill_uid_outside(uid)
    finally:
        shutil.rmtree(jobdir, ignore_errors=True)
        if uid is not None:
            _UIDS.release(uid)
    res = _result(out, err, timed_out, len(job["inputs"]), total, iso.mode, t0)
    res.cut_short = timed_out and total < own
    return res


def _result(
    out: str, err: str, timed_out: bool, n: int, total: float, mode: str, t0: float
) -> ProgramResult:
    """ProgramResult from the driver's lines, one dict literal each (see _sandbox_driver.py).

    Blame: before the driver's "ready" line nothing of the program has run, so
    a failure there is the machine's (sandbox_error, scored NaN). After it,
    only the program's code runs: a driver that stops early (killed by the
    program, or its compile() crashed the interpreter) fails the remaining
    cases as "killed" (a bug), and the total wall time fails them as "timeout".
    The driver's exit code is never read: the program could choose it.
    """
    wall = time.monotonic() - t0
    events = []
    for line in out.splitlines():
        try:
            ev = ast.literal_eval(line)  # literals only: nothing in a line is executed
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(ev, dict):
            events.append(ev)
    keys = {k for ev in events for k in ev}
    if "setup_error" in keys or "ready" not in keys:
        msg = next((ev["setup_error"] for ev in events if "setup_error" in ev), None)
        if msg is None:
            why = f"did not start within {total:.1f}s" if timed_out else "gave no result"
            msg = f"sandbox driver {why}: {err[-500:]!r}"
        return ProgramResult([CaseResult("sandbox_error") for _ in range(n)], None, msg, mode, wall)
    compile_error = next((ev["compile_error"] for ev in events if "compile_error" in ev), None)
    if compile_error is not None:
        cases = [CaseResult("runtime_error", stderr=compile_error) for _ in range(n)]
        return ProgramResult(cases, compile_error, None, mode, wall)
    done = {ev["case"]: ev["result"] for ev in events if "case" in ev}
    for r in done.values():  # call mode: the return value travels as JSON text
        if r.get("value") is not None:
            # The driver refuses what would not decode or nests too deep; should
            # anything still fail here, it is the program's value, not a crash of ours.
            try:
                r["value"] = json.loads(r["value"])
            except (ValueError, RecursionError, MemoryError) as e:
                r.update(status="runtime_error", value=None)
                r["stderr"] = f"{r['stderr']}\nreturn value could not be read back: {e!r}"[-2000:]
    if timed_out:
        rest = CaseResult("timeout", stderr=f"program exceeded its total wall time {total:.1f}s")
    else:
        rest = CaseResult("killed", stderr=f"the sandbox driver stopped early: {err[-500:]!r}")
    cases = [CaseResult(**done[i]) if i in done else dataclasses.replace(rest) for i in range(n)]
    # A test process whose rlimits / uid drop failed never ran the program.
    bad = next((i for i, c in enumerate(cases) if c.status == "sandbox_error"), None)
    if bad is not None:
        msg = f"test process set-up failed (case {bad})"
        return ProgramResult([CaseResult("sandbox_error") for _ in range(n)], None, msg, mode, wall)
    return ProgramResult(cases, None, None, mode, wall)


def _spawn(
    cmd: list[str], cwd: str, timeout: float, deadline: float | None = None
) -> tuple[str, str, bool]:
    """(stdout, stderr, timed out) of the driver; what it printed before a kill is kept.

    Whatever ends this call (a timeout, an exception, KeyboardInterrupt), the
    driver's process group is killed: no sandbox outlives it.
    """
    try:
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
    except OSError as e:  # the machine's fault (no interpreter, no unshare): NaN, not a bug
        return "", f"cannot start the sandbox {cmd[0]!r}: {e}", False
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        # The session holds unshare and the namespace's first process; killing
        # that one ends every process of the namespace.
        _killpg(proc.pid)
        # The pipes close as soon as the kill lands; never wait past the deadline.
        wait = 5.0 if deadline is None else max(0.05, deadline - time.monotonic() - 0.05)
        try:
            out, err = proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
        timed_out = True
    except BaseException:
        _killpg(proc.pid)
        proc.wait()
        raise
    return out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), timed_out


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
