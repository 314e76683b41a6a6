"""In a sandbox's forked test process: its set-up, then the program, run as CPython
runs a script.

Imported by `_sandbox_driver.py` before any untrusted code runs (as its siblings
`_sandbox_reap.py` and `_sandbox_root.py` are); standard library only. The driver
forks once per test case and calls `run_test_process` in the child, which never
returns: it moves the case's files onto fds 0..3, closes every fd of the driver's,
lowers its rlimits, sets no_new_privs, drops to the run's uid (or, still root, its
capabilities), asks to die with the driver, says on a private pipe that the set-up
finished, and only then executes the program. The program's exit status is
CPython's (SystemExit codes; its non-daemon threads and atexit handlers run at
the end; its streams flushed), so it cannot tell a set-up failure by its choice of
exit code (`EXIT_SETUP`): only the pipe does.
"""

import _signal as signal  # the C module: `signal` imports enum
import builtins
import ctypes
import fcntl
import io
import os
import resource
import sys

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
EXIT_RUNTIME, EXIT_MEMORY, EXIT_SETUP = 1, 3, 97
OK_FD = 100  # the test process's "set-up done" pipe, out of the way of 0..3

libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(f, ctypes.c_uint32) for f in ("effective", "permitted", "inheritable")]


def _drop_capabilities():
    """Empty capability sets (a test process still uid 0: root of its user namespace in userns).

    Without CAP_SYS_PTRACE the program cannot open the (non-dumpable) driver's
    /proc fds; with no_new_privs set, an execve cannot give them back.
    """
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def run_test_process(code, job, case, fds, ok_fd):
    """Runs in the forked test process. Never returns.

    fds: the case's stdin, stdout, stderr and return-value files (open in the
    driver, see `_anon_file`), to become fds 0..3.
    ok_fd: write end of the set-up pipe; one byte on it says the set-up
    finished, and it is closed before the program runs.
    """
    lim = job["limits"]
    try:
        driver = os.getppid()
        ok_fd = fcntl.fcntl(ok_fd, fcntl.F_DUPFD, OK_FD)  # clear of the dup2s below
        os.setpgid(0, 0)
        # Moved above 3 first, so that no dup2 onto 0..3 overwrites a source still to come.
        for dst, src in enumerate([fcntl.fcntl(fd, fcntl.F_DUPFD, 4) for fd in fds]):
            os.dup2(src, dst)
        os.closerange(4, ok_fd)  # nothing of the driver's stays open
        os.closerange(ok_fd + 1, 65536)
        cpu = max(1, int(lim["cpu_s"] + 0.999))
        mem = int(lim["memory_mb"]) << 20
        fsize = int(lim["fsize_mb"]) << 20
        nproc = int(job["nproc_base"]) + int(lim["nproc"])
        for res, val in (
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),
            (resource.RLIMIT_AS, (mem, mem)),
            (resource.RLIMIT_FSIZE, (fsize, fsize)),
            (resource.RLIMIT_CORE, (0, 0)),
            (resource.RLIMIT_NOFILE, (lim["nofile"], lim["nofile"])),
            (resource.RLIMIT_NPROC, (nproc, nproc)),
        ):
            resource.setrlimit(res, val)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if job["uid"] is not None:
            os.setgroups([])
            os.setgid(job["gid"])
            os.setuid(job["uid"])
            # Never run untrusted code with the starting privileges.
            if os.getuid() != job["uid"] or os.geteuid() != job["uid"]:
                os._exit(EXIT_SETUP)
        elif os.geteuid() == 0:
            _drop_capabilities()
        # Dies with the driver (set after the uid change, which clears it): where no
        # pid namespace ends everything, a killed driver leaves no test process running.
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != driver:  # the driver died before that
            os._exit(EXIT_SETUP)
        # The uid change left it non-dumpable (/proc/<pid> owned by root), which
        # would hide its processes from _kill_uid; the driver stays non-dumpable.
        libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        sys.stdin = sys.__stdin__ = _std_stream(0, "r", "<stdin>")
        sys.stdout = sys.__stdout__ = _std_stream(1, "w", "<stdout>")
        sys.stderr = sys.__stderr__ = _std_stream(2, "w", "<stderr>")
        sys.argv = ["solution.py"]
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.write(ok_fd, b"\x01")
        os.close(ok_fd)
    except BaseException:
        os._exit(EXIT_SETUP)
    status = 0
    try:
        g = {
            "__name__": "__main__" if job["mode"] == "stdin" else "__solution__",
            "__builtins__": builtins,
        }
        exec(code, g)
        if job["mode"] == "call":
            fn = g.get(job["fn_name"])
            if fn is None and isinstance(g.get("Solution"), type):
                fn = getattr(g["Solution"](), job["fn_name"])
            if not callable(fn):
                raise NameError(f"function {job['fn_name']!r} is not defined")
            args = case if isinstance(case, list) else [case]
            value = fn(*args)
            import json  # imported by main() before the fork, in call mode

            enc = json.dumps(
                value, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else repr(o)
            ).encode()
            while enc:  # a large value: one write() may take only part of it
                enc = enc[os.write(3, enc) :]
    except SystemExit as e:
        # As CPython's exit code: only None and the int 0 (False too) are success.
        # `in (None, 0)` compared with ==, so SystemExit(0.0) passed.
        ok = e.code is None or (isinstance(e.code, int) and e.code == 0)
        status = 0 if ok else EXIT_RUNTIME
    except MemoryError:
        status = EXIT_MEMORY
    except BaseException:
        status = EXIT_RUNTIME
        try:
            # The interpreter's own display (C, as for an uncaught exception): the
            # `traceback` module would cost every program its import (~4 ms).
            sys.__excepthook__(*sys.exc_info())
        except BaseException:
            pass
    _finalize()
    # As CPython's shutdown: sys.stdout / sys.stderr unless None or closed (a closed
    # one was scored a runtime error), then the original streams (output printed
    # before the program replaced sys.stdout was lost).
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if f is not None and not getattr(f, "closed", False):
                f.flush()
        except BaseException:
            status = status or EXIT_RUNTIME
    os._exit(status)


def _std_stream(fd: int, mode: str, name: str) -> io.TextIOWrapper:
    """sys.stdin / stdout / stderr over `fd`, with CPython's `mode` and `name` (FastIO
    templates read `sys.stdout.mode`; without it they failed)."""
    raw = io.FileIO(fd, mode, closefd=False)
    raw.name = name
    buf = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    text = io.TextIOWrapper(buf, encoding="utf-8", errors="replace" if mode == "r" else None)
    text.mode = mode
    return text


def _finalize() -> None:
    """What CPython does at exit before flushing: wait for the program's non-daemon
    threads (`threading.Thread(target=main).start()` without a join), then run its
    atexit handlers. os._exit skipped both: their output was lost. A thread that
    never ends runs into the wall-time limit, as under CPython."""
    threading = sys.modules.get("threading")
    shutdown = getattr(threading, "_shutdown", None)
    try:
        if shutdown is not None:
            shutdown()
    except BaseException:
        pass
    try:
        import atexit  # built in: no file is read

        atexit._run_exitfuncs()
    except BaseException:
        pass
