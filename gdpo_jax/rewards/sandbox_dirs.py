"""The sandbox's base directory: one per process, root-owned, removed at exit; and the
sweep that removes those of killed processes (their owner lock is free)."""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import shutil
import tempfile
import threading

__all__ = ["base_dir", "remove_stale_base_dirs"]

log = logging.getLogger("gdpo_jax.sandbox")

_BASE_LOCK = threading.Lock()
_BASE_DIR: list[str] = []
_BASE_PREFIX = "gdpo_sandbox_"
# Held (flock) for the owning process's life, and its forked children's: a base
# directory whose lock anyone can take belongs to a process that is gone.
_OWNER = ".owner"
_OWNER_FD: list[int] = []


def base_dir() -> str:
    """This process's sandbox base directory, made (and locked) on first use."""
    # Root-owned, 0711: an unprivileged test uid can neither list it nor
    # create files beside its own working directory.
    with _BASE_LOCK:
        if not _BASE_DIR:
            remove_stale_base_dirs()
            d = tempfile.mkdtemp(prefix=_BASE_PREFIX)
            os.chmod(d, 0o711)
            # Locked before it takes the name the sweep looks for, so no sweep can
            # find it unlocked (a rename keeps the lock: it is the inode's).
            fd = os.open(os.path.join(d, _OWNER + ".new"), os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(os.path.join(d, _OWNER + ".new"), os.path.join(d, _OWNER))
            _OWNER_FD.append(fd)
            _BASE_DIR.append(d)
            atexit.register(shutil.rmtree, d, True)
        return _BASE_DIR[0]


def remove_stale_base_dirs(tmp: str | None = None) -> list[str]:
    """Remove the sandbox directories that killed processes left in `tmp`.

    A process removes its own at exit; one killed (SIGKILL, OOM) cannot. A
    directory is stale when its owner lock is free: no live process (in any pid
    namespace on this kernel) holds it. Directories of other users, and any not
    yet locked, are left. Returns the paths removed.
    """
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(_BASE_PREFIX)]
    except OSError:
        return removed
    for name in names:
        d = os.path.join(tmp, name)
        try:
            if os.lstat(d).st_uid != os.geteuid():
                continue
            fd = os.open(os.path.join(d, _OWNER), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # not a sandbox directory of ours, or not yet locked
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # its owner is alive
        shutil.rmtree(d, ignore_errors=True)
        os.close(fd)
        removed.append(d)
    if removed:
        log.info("removed %d sandbox directories of killed processes", len(removed))
    return removed
