"""In-sandbox driver: runs ONE untrusted program against its test inputs.

Started by `gdpo_jax.rewards.sandbox` as `python -I -S -B _sandbox_driver.py JOB`
(inside fresh namespaces when the machine allows it). Standard library only:
it must not import gdpo_jax (nor jax), because it starts once per program.

Protocol: JOB is a `marshal` file (written by the same interpreter, readable
by the starting user) with keys
  source, mode ("stdin" | "call"), fn_name, inputs (list), limits (dict),
  uid, gid (int | null: drop to this uid in each test process),
  private_mounts (bool), keep_paths (list[str]), workdir (str | null),
  iodir (str | null: where each case's stdin/stdout/stderr/result files go
  when private_mounts is false),
  nproc_base (int), preload (list[str]: imported before the first case),
  sys_path (list[str]: site-packages directories, put on sys.path here since
  -S skips `site` and its .pth hooks).
The driver prints one `ascii()` dict literal per line on stdout, as it goes
(the parent reads them with `ast.literal_eval`):
  {"setup_error": str}    isolation could not be set up (nothing ran), or
  {"ready": true}         set up; from here on only the program's code runs
  {"compile_error": str}  the source does not compile (any exception of compile())
  {"start": i} / {"case": i, "result": {"status", "stdout", "stderr", "value",
                 "time_s", "truncated"}}   per test case ("value": the JSON text
                 of the return value in call mode, else None)
  {"end": true}
The program cannot forge these lines: the test process never holds the
driver's stdout (its fds are replaced and closed before the program runs) and
the driver is not dumpable, so /proc/<driver>/fd is closed to the program even
under the same uid. Whether a test process's own set-up (rlimits, uid drop)
finished travels on a private pipe closed before the program starts, never in
an exit code, which the program chooses (`os._exit(97)`).

Imports are part of every program's cost (one interpreter start per program):
marshal and `_signal` instead of json and signal keep enum, re, functools and
collections out of the driver (about 8 ms of a 19 ms start); json is imported
only in call mode, where the return value travels as JSON.

Design: the source is compiled once here; every test case runs in a child
forked from this (already warmed-up) interpreter, so a case costs a fork, not
an interpreter start. The child lowers its rlimits, drops to an unprivileged
uid (when given) and only then executes the program. The expected outputs
never enter the sandbox: comparison happens in the trusted parent process.
"""

import _signal as signal  # the C module: `signal` imports enum
import builtins
import ctypes
import fcntl
import io
import marshal
import os
import resource
import stat
import sys
import time

_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC = 2, 4, 4096, 16384
_PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 4, 36, 38
_EXIT_RUNTIME, _EXIT_MEMORY, _EXIT_SETUP = 1, 3, 97
_OK_FD = 100  # the test process's "set-up done" pipe, out of the way of 0..3
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(src, target, fstype, flags, data):
    rc = _libc.mount(
        src.encode() if src else None,
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or 'bind'} {src} -> {target}: {os.strerror(err)}")


def _private_mounts(keep_paths, tmpfs_mb):
    """Fresh tmpfs over world-writable dirs; re-expose the interpreter.

    Needs root in a private mount namespace. World-writable dirs (/tmp, ...)
    get an empty tmpfs so writes there vanish with the namespace. A private
    ancestor of the interpreter (e.g. /root, mode 0700, when python lives in
    /root/.pyenv) gets a 0755 tmpfs with only the needed child bound back,
    so the unprivileged test process can still import the standard library.
    Originals are reached through O_PATH fds opened BEFORE anything is
    hidden (bind from /proc/self/fd/N).
    """
    targets = {d: set() for d in _WORLD_WRITABLE if os.path.isdir(d) and not os.path.islink(d)}
    for p in keep_paths:
        p = os.path.realpath(p)
        if not os.path.exists(p):
            continue
        parts = p.strip("/").split("/")
        for i in range(len(parts)):
            anc = "/" + "/".join(parts[:i])
            child = parts[i]
            if anc in _WORLD_WRITABLE and anc in targets:
                targets[anc].add(child)
                break
            if anc != "/" and not os.stat(anc).st_mode & stat.S_IXOTH:
                targets.setdefault(anc, set()).add(child)
                break
    fds = {}
    for anc, children in targets.items():
        for c in children:
            fds[(anc, c)] = os.open(os.path.join(anc, c), os.O_PATH)
    for anc in sorted(targets, key=len):
        ww = anc in _WORLD_WRITABLE
        size = f"{tmpfs_mb}m" if anc == "/tmp" else ("4m" if ww else "64k")
        mode = "1777" if ww else "0755"
        _mount("tmpfs", anc, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={size},mode={mode}")
        for c in sorted(targets[anc]):
            dst = os.path.join(anc, c)
            if os.path.isdir(f"/proc/self/fd/{fds[(anc, c)]}"):
                os.mkdir(dst)
            else:
                open(dst, "w").close()
            _mount(f"/proc/self/fd/{fds[(anc, c)]}", dst, None, _MS_BIND | _MS_REC, None)
    for fd in fds.values():
        os.close(fd)
    os.makedirs("/tmp/.gdpo_io", mode=0o700)
    os.makedirs("/tmp/work", mode=0o700)
    return "/tmp/work", "/tmp/.gdpo_io"


def _count_uid_tasks(uid):
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                n += (
                    len(os.listdir(f"/proc/{pid}/task"))
                    if os.stat(f"/proc/{pid}").st_uid == uid
                    else 0
                )
            except OSError:
                pass
    return n


def _kill_uid(uid):
    """SIGKILL every process of `uid` (repeat: a fork bomb refills)."""
    for _ in range(100):
        found = False
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    os.kill(int(pid), signal.SIGKILL)
                    found = True
            except OSError:
                pass
        _reap()
        if not found:
            return
        time.sleep(0.005)


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


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
    if _libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _child(code, job, case, stdin_path, out_path, err_path, res_path, ok_fd):
    """Runs in the forked test process. Never returns.

    ok_fd: write end of the set-up pipe; one byte on it says the set-up
    finished, and it is closed before the program runs.
    """
    lim = job["limits"]
    try:
        ok_fd = fcntl.fcntl(ok_fd, fcntl.F_DUPFD, _OK_FD)  # clear of the dup2s below
        os.setpgid(0, 0)
        for fd, path, flags in (
            (0, stdin_path, os.O_RDONLY),
            (1, out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (3, res_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            new = os.open(path, flags, 0o600)
            if new != fd:
                os.dup2(new, fd)
                os.close(new)
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
        _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if job["uid"] is not None:
            os.setgroups([])
            os.setgid(job["gid"])
            os.setuid(job["uid"])
            # Never run untrusted code with the starting privileges.
            if os.getuid() != job["uid"] or os.geteuid() != job["uid"]:
                os._exit(_EXIT_SETUP)
        elif os.geteuid() == 0:
            _drop_capabilities()
        # The uid change left it non-dumpable (/proc/<pid> owned by root), which
        # would hide its processes from _kill_uid; the driver stays non-dumpable.
        _libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        sys.stdin = io.TextIOWrapper(
            io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8", errors="replace"
        )
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8"
        )
        sys.stderr = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8"
        )
        sys.argv = ["solution.py"]
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.write(ok_fd, b"\x01")
        os.close(ok_fd)
    except BaseException:
        os._exit(_EXIT_SETUP)
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
            )
            os.write(3, enc.encode())
    except SystemExit as e:
        status = 0 if e.code in (None, 0) else _EXIT_RUNTIME
    except MemoryError:
        status = _EXIT_MEMORY
    except BaseException:
        status = _EXIT_RUNTIME
        try:
            # The interpreter's own display (C, as for an uncaught exception): the
            # `traceback` module would cost every program its import (~4 ms).
            sys.__excepthook__(*sys.exc_info())
        except BaseException:
            pass
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:
            status = status or _EXIT_RUNTIME
    os._exit(status)


def _read(path, cap, tail=False):
    """The first (or, tail=True, the last) `cap` bytes of a file, and whether it held more."""
    try:
        with open(path, "rb") as f:
            if tail:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - cap))
                return f.read(cap).decode("utf-8", errors="replace"), size > cap
            data = f.read(cap + 1)
    except OSError:
        return "", False
    return data[:cap].decode("utf-8", errors="replace"), len(data) > cap


def _run_case(code, job, i, case, iodir):
    lim = job["limits"]
    stdin_path = os.path.join(iodir, f"in{i}")
    with open(stdin_path, "w", encoding="utf-8") as f:
        if job["mode"] == "stdin":
            f.write(case if isinstance(case, str) else "\n".join(map(str, case)))
    paths = [os.path.join(iodir, f"{k}{i}") for k in ("out", "err", "res")]
    sys.stdout.flush()
    ok_r, ok_w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(ok_r)
        _child(code, job, case, stdin_path, *paths, ok_w)
    os.close(ok_w)
    deadline, delay, killed, status, ru = t0 + lim["wall_s"], 0.001, False, None, None
    while True:
        wpid, status, ru = os.wait4(pid, os.WNOHANG)
        if wpid:
            break
        if time.monotonic() > deadline:
            killed = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            os.kill(pid, signal.SIGKILL)
            wpid, status, ru = os.wait4(pid, 0)
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    elapsed = time.monotonic() - t0
    if job["uid"] is not None:
        _kill_uid(job["uid"])  # leftovers of this case (daemons, fork bombs)
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    _reap()
    # Every holder of the write end is gone: b"" = its set-up failed.
    set_up = os.read(ok_r, 1) == b"\x01"
    os.close(ok_r)
    cap = int(lim["output_bytes"])
    out, trunc = _read(paths[0], cap)
    err, _ = _read(paths[1], 4096, tail=True)  # a traceback ends the file
    res, _ = _read(paths[2], cap)
    fsize = int(lim["fsize_mb"]) << 20
    big = any(os.path.exists(p) and os.path.getsize(p) >= fsize for p in paths[:2])
    cpu_used = (ru.ru_utime + ru.ru_stime) if ru else 0.0
    if not set_up and not killed:
        st = "sandbox_error"  # rlimits / uid drop failed: the program never ran
    elif os.WIFEXITED(status):
        # Whatever the code, the program chose it (97 included): only ok_fd
        # tells a set-up failure.
        st = {0: "ok", _EXIT_MEMORY: "memory_error"}.get(os.WEXITSTATUS(status), "runtime_error")
    else:
        sig = os.WTERMSIG(status)
        if killed or sig == signal.SIGXCPU or cpu_used >= lim["cpu_s"]:
            st = "timeout"
        elif sig == signal.SIGXFSZ:
            st = "output_limit"
        else:
            st = "killed"
    if big and st != "timeout":
        st = "output_limit"
    value = None
    if st == "ok" and job["mode"] == "call":
        import json  # imported by main() in call mode

        try:
            json.loads(res)
            value = res
        except ValueError:
            st = "runtime_error"
            err = (err + "\nreturn value could not be read back").strip()
    for p in [stdin_path] + paths:
        try:
            os.unlink(p)
        except OSError:
            pass
    return {
        "status": st,
        "stdout": out,
        "stderr": err[-2000:],
        "value": value,
        "time_s": round(elapsed, 4),
        "truncated": trunc,
    }


def _emit(obj):
    print(ascii(obj), flush=True)  # one line: ascii() escapes newlines and non-ASCII


def main():
    # Before anything else: same-uid processes (the program, in the weaker
    # modes) can then neither open /proc/<driver>/fd/1 nor ptrace the driver.
    _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    with open(sys.argv[1], "rb") as f:
        job = marshal.load(f)
    try:
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if job["private_mounts"]:
            workdir, iodir = _private_mounts(job["keep_paths"], job["limits"]["tmpfs_mb"])
        else:
            workdir, iodir = job["workdir"], job["iodir"]
        if job["uid"] is not None:
            os.chown(workdir, job["uid"], job["gid"])
        else:
            job["nproc_base"] = _count_uid_tasks(os.getuid())
        os.chdir(workdir)
        sys.path.extend(p for p in job.get("sys_path", ()) if p not in sys.path)
        if job["mode"] == "call":
            import json  # noqa: F401 - the test processes encode return values with it
        for name in job.get("preload", ()):
            try:
                __import__(name)
            except ImportError:
                pass
    except Exception as e:  # isolation could not be set up: run nothing
        _emit({"setup_error": f"{type(e).__name__}: {e}"})
        return
    _emit({"ready": True})
    try:
        code = compile(job["source"], "solution.py", "exec")
    except Exception as e:  # noqa: BLE001 - SyntaxError, and RecursionError / MemoryError
        # of degenerate sources (3,000-term sums, deep unary minus): the program's fault
        _emit({"compile_error": f"{type(e).__name__}: {str(e)[:2000]}"})
        return
    for i, case in enumerate(job["inputs"]):
        _emit({"start": i})
        _emit({"case": i, "result": _run_case(code, job, i, case, iodir)})
    _emit({"end": True})


if __name__ == "__main__":
    main()
    # Everything is emitted (flushed line by line): skip the interpreter's
    # teardown (~2-3 ms per program). An exception out of main still exits 1.
    sys.stdout.flush()
    os._exit(0)
