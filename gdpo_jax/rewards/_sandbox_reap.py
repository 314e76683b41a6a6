"""What a sandbox case leaves behind, killed: the driver's clean-up after each case.

Standard library only, imported by `_sandbox_driver.py` before any untrusted code
runs (as its siblings `_sandbox_child.py` and `_sandbox_root.py` are). How far the
clean-up reaches depends on the isolation mode:

- pid namespace modes (`namespaces`, `userns`): the driver is pid 1 there and kills
  every other process in the namespace (`kill(-1)`), whatever its session;
- `setuid`: every process of the run's own uid;
- `rlimits`: the case's process group, then every process below the driver, which is
  a child subreaper, so a daemon that left its session (`setsid`) is still below it.
"""

import _signal as signal  # the C module: `signal` imports enum
import os
import time


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
        reap()
        if not found:
            return
        time.sleep(0.005)


def _kill_namespace():
    """As pid 1 of a pid namespace: SIGKILL every other process in it, and reap them.

    kill(-1) reaches exactly this namespace's processes but not its init (this
    driver), whatever their process group or session (`setsid`). A process
    with SIGKILL pending cannot complete a fork, and every orphan is
    re-parented to init, so once no child is left none is left at all; the
    loop checks that with one more kill(-1) (ESRCH: nothing to signal).
    """
    for _ in range(100):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break


def _descendants(root):
    """Pids of every process below `root`, from each process's parent in /proc/<pid>/stat
    (`/proc/<pid>/task/<tid>/children` needs CONFIG_PROC_CHILDREN, not always built)."""
    kids = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and ")".
        ppid = int(stat[stat.rfind(b")") + 2 :].split(None, 2)[1])
        kids.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in kids.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _kill_descendants():
    """SIGKILL every process below this driver, and reap them (rlimits mode).

    The driver is a child subreaper (`main`), so a daemon that left its process group
    and session (`setsid`, a double fork) is re-parented to it, never to the host's
    init: the whole tree stays below the driver. All of it is killed at once; a process
    with SIGKILL pending cannot complete a fork, and one forked between the scan and
    the kill is found by the next scan.
    """
    me = os.getpid()
    for _ in range(100):
        # Any process below a subreaper has a child of it for ancestor (or is one): no
        # child, nothing below, and the /proc scan (a file per host process) is skipped.
        try:
            os.waitpid(-1, os.WNOHANG)  # reaps one exited child, if there is one
        except ChildProcessError:
            return
        pids = _descendants(me)
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        reap()
        time.sleep(0.001)


def kill_leftovers(pid, job):
    """Every process the case left (daemons, fork bombs), as far as the mode allows."""
    if os.getpid() == 1:  # pid namespace modes: this driver is its init
        _kill_namespace()
    elif job["uid"] is not None:  # setuid mode: the run's own uid
        _kill_uid(job["uid"])
    else:  # rlimits mode: the driver's whole tree (a setsid daemon included)
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        _kill_descendants()
    reap()


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
