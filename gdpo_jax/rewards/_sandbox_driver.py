"""In-sandbox driver: runs ONE untrusted program against its test inputs.

Started by `gdpo_jax.rewards.sandbox` as `python -I -S -B _sandbox_driver.py JOB`
(inside fresh namespaces when the machine allows it). Standard library only:
it must not import gdpo_jax (nor jax), because it starts once per program.

Protocol: JOB is a `marshal` file (written by the same interpreter, readable
by the starting user) with keys
  source, mode ("stdin" | "call"), fn_name, inputs (list), limits (dict),
  uid, gid (int | null: drop to this uid in each test process),
  private_mounts (bool), keep_paths (list[str]), workdir (str | null),
  iodir (str | null: a directory for the per-case files when private_mounts
  is false; used only where memfd_create is refused, see `_anon_file`),
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
                 of the return value in call mode, else None; at most
                 limits["value_bytes"] long and _MAX_VALUE_DEPTH deep)
  {"end": true}
The program cannot forge these lines: the test process never holds the
driver's stdout (its fds are replaced and closed before the program runs) and
the driver is not dumpable, so /proc/<driver>/fd is closed to the program even
under the same uid. Whether a test process's own set-up (rlimits, uid drop)
finished travels on a private pipe closed before the program starts, never in
an exit code, which the program chooses (`os._exit(97)`). Such a failure is a
"sandbox_error" (the machine's) only while no case of the program has run:
after that, what the program left behind may be the cause, so it is the
program's failure.

A case's stdin/stdout/stderr/return-value files are anonymous (memfd), made
by the driver and handed to the test process as fds: they have no name, so the
program cannot pre-create, replace or block them for a later case. In the pid
namespace modes the driver is pid 1 there and kills every other process after
each case (a `setsid` daemon escapes its process group); in rlimits mode, every
process below it (a child subreaper's tree holds such a daemon). The driver watches
its stdout: once the runner is gone (its read end closed), it kills the case
and exits, so an abandoned sandbox does not run on.

Imports are part of every program's cost (one interpreter start per program):
marshal and `_signal` instead of json and signal keep enum, re, functools and
collections out of the driver (about 8 ms of a 19 ms start); json is imported
only in call mode, where the return value travels as JSON.

Design: the source is compiled once here; every test case runs in a child
forked from this (already warmed-up) interpreter, so a case costs a fork, not
an interpreter start. The child (`_sandbox_child.run_test_process`) lowers its
rlimits, drops to an unprivileged uid (when given) and only then executes the
program. The expected outputs
never enter the sandbox: comparison happens in the trusted parent process.
"""

import _signal as signal  # the C module: `signal` imports enum
import marshal
import os
import select
import sys
import time

# The test process's side and the clean-up after each case are the sibling modules'.
# -I leaves this directory off the path: it goes on for these imports and comes off
# again (the program's path).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _sandbox_child  # noqa: E402
import _sandbox_reap  # noqa: E402

del sys.path[0]

# A return value nested deeper than this is refused (runtime_error): the parent
# decodes it with json (C recursion) and compares it recursively in a reward
# thread whose stack is already deep; 100 levels leave a wide margin under the
# interpreter's recursion limit (1000) there, and no test expects more.
_MAX_VALUE_DEPTH = 100


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


def _anon_file(iodir):
    """A read-write file with no name: memfd, or an O_TMPFILE in `iodir` where memfd is refused.

    Nameless, it cannot be pre-created, replaced, turned into a directory or a
    FIFO by the program (a named file in a directory it can write could be, and
    a test process that cannot open its files never ran: that used to be scored
    as the machine's fault). RLIMIT_FSIZE bounds the test process's writes to it.
    """
    try:
        return os.memfd_create("gdpo_case", 0)
    except OSError:
        return os.open(iodir, os.O_TMPFILE | os.O_EXCL | os.O_RDWR, 0o600)


def _read(fd, cap, tail=False):
    """The first (or, tail=True, the last) `cap` bytes of a file, and whether it held more."""
    size = os.fstat(fd).st_size
    pos = max(0, size - cap) if tail else 0
    chunks, want = [], min(cap, size - pos)
    while want > 0:
        b = os.pread(fd, want, pos)
        if not b:
            break
        chunks.append(b)
        pos, want = pos + len(b), want - len(b)
    return b"".join(chunks).decode("utf-8", errors="replace"), size > cap


def _too_deep(value, limit):
    """Whether `value` nests lists / dicts more than `limit` levels (no recursion)."""
    stack = [(value, 1)] if isinstance(value, (list, dict)) else []
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        items = v.values() if isinstance(v, dict) else v
        stack.extend((x, depth + 1) for x in items if isinstance(x, (list, dict)))
    return False


def _run_case(code, job, case, iodir, ran, watch):
    """One test case: (result dict, whether its test process finished its set-up).

    ran: whether a test process of this program finished its set-up before (so
    the program has run). watch: poll object on this driver's stdout.
    """
    fds = [_anon_file(iodir) for _ in range(4)]  # stdin, stdout, stderr, return value
    try:
        if job["mode"] == "stdin":
            data = (case if isinstance(case, str) else "\n".join(map(str, case))).encode()
            while data:
                data = data[os.write(fds[0], data) :]
            os.lseek(fds[0], 0, os.SEEK_SET)  # the test process shares this offset
        return _run_case_files(code, job, case, fds, ran, watch)
    finally:
        for fd in fds:
            os.close(fd)


def _run_case_files(code, job, case, fds, ran, watch):
    lim = job["limits"]
    sys.stdout.flush()
    ok_r, ok_w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(ok_r)
        _sandbox_child.run_test_process(code, job, case, fds, ok_w)
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
        # Sleeps like time.sleep(delay), but wakes at once when the reader of the
        # results is gone (POLLERR on a pipe whose read end closed: the runner
        # process died or killed this sandbox's process group): end everything now.
        if watch.poll(max(1, int(delay * 1000))):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            os.kill(pid, signal.SIGKILL)
            _sandbox_reap.kill_leftovers(pid, job)
            os._exit(1)
        delay = min(delay * 2, 0.02)
    elapsed = time.monotonic() - t0
    _sandbox_reap.kill_leftovers(pid, job)
    # Every holder of the write end is gone: b"" = its set-up failed.
    set_up = os.read(ok_r, 1) == b"\x01"
    os.close(ok_r)
    out, trunc = _read(fds[1], int(lim["output_bytes"]))
    err, _ = _read(fds[2], 4096, tail=True)  # a traceback ends the file
    fsize = int(lim["fsize_mb"]) << 20
    big = any(os.fstat(fd).st_size >= fsize for fd in fds[1:3])
    cpu_used = (ru.ru_utime + ru.ru_stime) if ru else 0.0
    if not set_up and not killed:
        if not ran:
            st = "sandbox_error"  # rlimits / uid drop failed: the program never ran
        else:
            # After the program has run, what it left behind may be why (a daemon
            # of an earlier case killing this one, ...): the program's failure.
            st = "runtime_error" if os.WIFEXITED(status) else "killed"
            err = "the test process's set-up failed after earlier cases of the program ran"
    elif os.WIFEXITED(status):
        # Whatever the code, the program chose it (97 included): only ok_fd
        # tells a set-up failure.
        st = {0: "ok", _sandbox_child.EXIT_MEMORY: "memory_error"}.get(
            os.WEXITSTATUS(status), "runtime_error"
        )
        if cpu_used > lim["cpu_s"]:
            # RLIMIT_CPU has whole seconds (1.5 became 2) and SIGXCPU can be ignored:
            # a program that exits on its own over its CPU time is a timeout too.
            st = "timeout"
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

        vcap = int(lim["value_bytes"])
        res, too_long = _read(fds[3], vcap)
        why = None
        if too_long:
            st, why = "output_limit", f"return value longer than value_bytes={vcap}"
        else:
            try:
                if _too_deep(json.loads(res), _MAX_VALUE_DEPTH):
                    why = f"return value nested deeper than {_MAX_VALUE_DEPTH} levels"
                else:
                    value = res
            except (ValueError, RecursionError, MemoryError):
                why = "return value could not be read back"
            if why:
                st = "runtime_error"
        if why:
            err = (err + "\n" + why).strip()
    result = {
        "status": st,
        "stdout": out,
        "stderr": err[-2000:],
        "value": value,
        "time_s": round(elapsed, 4),
        "truncated": trunc,
    }
    return result, set_up


def _emit(obj):
    print(ascii(obj), flush=True)  # one line: ascii() escapes newlines and non-ASCII


def main():
    # Before anything else: same-uid processes (the program, in the weaker
    # modes) can then neither open /proc/<driver>/fd/1 nor ptrace the driver.
    _sandbox_child.libc.prctl(_sandbox_child.PR_SET_DUMPABLE, 0, 0, 0, 0)
    with open(sys.argv[1], "rb") as f:
        job = marshal.load(f)
    try:
        _sandbox_child.libc.prctl(_sandbox_child.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        # Imported before the minimal root: trusted standard-library code, whose
        # shared libraries may lie outside the trees that root holds.
        sys.path.extend(p for p in job.get("sys_path", ()) if p not in sys.path)
        if job["mode"] == "call":
            import json  # noqa: F401 - the test processes encode return values with it
        for name in job.get("preload", ()):
            try:
                __import__(name)
            except ImportError:
                pass
        if job["private_mounts"]:
            # The set-up's sibling module, imported only by the modes that use it, as
            # `_sandbox_reap` above.
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import _sandbox_root

            del sys.path[0]
            workdir, iodir = _sandbox_root.minimal_root(
                job["keep_paths"],
                job.get("hide_paths", ()),
                job["limits"]["tmpfs_mb"],
                pivot=job.get("pivot_root", True),
            )
        else:
            workdir, iodir = job["workdir"], job["iodir"]
        if job["uid"] is not None:
            os.chown(workdir, job["uid"], job["gid"])
        else:
            job["nproc_base"] = _count_uid_tasks(os.getuid())
        os.chdir(workdir)
        watch = select.poll()
        watch.register(sys.stdout.fileno(), 0)  # POLLERR / POLLHUP only
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
    ran = False
    for i, case in enumerate(job["inputs"]):
        _emit({"start": i})
        result, set_up = _run_case(code, job, case, iodir, ran, watch)
        ran = ran or set_up
        _emit({"case": i, "result": result})
    _emit({"end": True})


if __name__ == "__main__":
    main()
    # Everything is emitted (flushed line by line): skip the interpreter's
    # teardown (~2-3 ms per program). An exception out of main still exits 1.
    sys.stdout.flush()
    os._exit(0)
