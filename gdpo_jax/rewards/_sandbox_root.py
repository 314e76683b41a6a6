"""The sandbox's minimal root: build it and enter it (the driver's set-up).

Imported by `_sandbox_driver.py` only, inside the sandbox's fresh namespaces,
before any untrusted code runs. Standard library only, like the driver, which
starts once per program.
"""

import ctypes
import os

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT = 1, 2, 4, 32
_MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE, _MNT_DETACH = 4096, 8192, 16384, 1 << 18, 2
# A read-only remount must repeat the flags the kernel may have locked on the
# source mount (a user namespace may not change them): statvfs's ST_* bit -> MS_*.
_ST_TO_MS = ((2, 2), (4, 4), (8, 8), (1024, 1024), (2048, 2048), (4096, 1 << 21))
_ST_NOATIME, _ST_RELATIME, _MS_STRICTATIME = 1024, 4096, 1 << 24
# mount_setattr (Linux 5.12; one number on every architecture): read-only for a
# whole tree at once, submounts included, without restating any flag.
_SYS_MOUNT_SETATTR, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY, _AT_FDCWD = 442, 0x8000, 1, -100
# The trees of the minimal root bound from the host (a symlink is copied as one).
# Of /nix and /gnu only the store: /nix/var holds nix-daemon's socket, which a
# program could ask to build (and fetch) outside the sandbox.
_SYSTEM_TOPS = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/nix/store",
    "/gnu/store",
)  # fmt: skip
_DEVICES = ("null", "zero", "full", "random", "urandom")
# pivot_root has no glibc wrapper: its system call number per ABI (machine, pointer
# bytes); a 32-bit userland on a 64-bit kernel uses the 32-bit ABI's number.
_PIVOT_ROOT = {
    ("x86_64", 8): 155, ("x86_64", 4): 217, ("i686", 4): 217, ("i586", 4): 217,
    ("i386", 4): 217, ("aarch64", 8): 41, ("arm64", 8): 41, ("aarch64", 4): 218,
    ("armv7l", 4): 218, ("armv8l", 4): 218, ("armv6l", 4): 218, ("riscv64", 8): 41,
    ("loongarch64", 8): 41, ("ppc64le", 8): 203, ("ppc64", 8): 203, ("s390x", 8): 217,
}  # fmt: skip

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


def _locked_flags(path):
    """MS_* flags to repeat when remounting the mount at `path` (see _ST_TO_MS)."""
    st = os.statvfs(path).f_flag
    flags = sum(ms for st_bit, ms in _ST_TO_MS if st & st_bit)
    return flags | (0 if st & (_ST_NOATIME | _ST_RELATIME) else _MS_STRICTATIME)


def _mounts_below(path):
    """Mount points strictly below `path`, from /proc/self/mountinfo (octal escapes
    decoded), parents first."""
    out = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            raw, point, i = line.split()[4], bytearray(), 0
            while i < len(raw):  # the kernel writes space, tab, newline, \\ as \ooo
                esc = raw[i + 1 : i + 4]
                if raw[i] == 92 and len(esc) == 3 and esc.isdigit():
                    point.append(int(esc, 8))
                    i += 4
                else:
                    point.append(raw[i])
                    i += 1
            point = os.fsdecode(bytes(point))
            if point.startswith(path.rstrip("/") + "/"):
                out.append(point)
    return sorted(out, key=len)


def _read_only(dst):
    """Make the mount at `dst` and every mount below it read-only."""
    attr = (ctypes.c_uint64 * 4)(_MOUNT_ATTR_RDONLY, 0, 0, 0)  # set, clear, propagation, userns
    rc = _libc.syscall(
        ctypes.c_long(_SYS_MOUNT_SETATTR),
        ctypes.c_int(_AT_FDCWD),
        dst.encode(),
        ctypes.c_uint(_AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    if rc == 0:
        return
    # An older kernel: remount each mount of the tree, the top one first.
    for point in [dst, *_mounts_below(dst)]:
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _locked_flags(point)
        try:
            _mount(None, point, None, flags, None)
        except OSError:
            if point == dst:
                raise


def _bind(fd, dst, read_only):
    """Bind the file or tree open at O_PATH `fd` at `dst` (made as a directory or
    an empty file), read-only (submounts too) if asked."""
    src = f"/proc/self/fd/{fd}"
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    # Recursive: a user namespace refuses to bind a tree without the mounts below it.
    _mount(src, dst, None, _MS_BIND | _MS_REC, None)
    if read_only:
        _read_only(dst)


def _covered(path, tops):
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in tops)


def _through_links(path, links):
    """`path` as the new root resolves its first component, where that is one of the
    system symlinks copied into it (`/lib` -> `usr/lib`)."""
    for link, target in links:
        if path == link or path.startswith(link + "/"):
            return os.path.normpath(os.path.join("/", target) + path[len(link) :])
    return path


def minimal_root(keep_paths, hide_paths, tmpfs_mb, pivot=True):
    """Build a root holding only what a program needs, and enter it.

    Needs root in a private mount namespace whose pid namespace it leads (the
    modes with `private_tmp`). The new root is a tmpfs with, read-only (the
    mounts below them too): the system's program and library trees (/usr, /lib*,
    /bin, /sbin, /etc, /nix/store, /gnu/store) and `keep_paths` (the
    interpreter's prefixes and site-packages) at their own paths, a path reached
    through a symlink at both spellings; over `hide_paths` found inside those
    (this package, installed: its sample data holds expected outputs), an empty
    directory; this pid namespace's /proc; the device nodes null, zero, full,
    random and urandom (read-only binds: their I/O works, chmod does not); and
    fresh writable tmpfs at /tmp (`tmpfs_mb`), /var/tmp and /dev/shm. Nothing
    else of the host is there: not its home directories, the working tree, the
    task's data files or the checkpoints, readable or not. Returns the work
    directory and the directory for the per-case files where memfd is refused.
    """
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)  # nothing leaks back out
    links, binds, tops = [], [], []  # binds: (source, path in the new root, read-only)
    for top in _SYSTEM_TOPS:
        if os.path.islink(top):  # merged /usr: /lib -> usr/lib
            links.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            binds.append((top, top, True))
            tops.append(top)
    for p in sorted({q for k in keep_paths for q in (k, os.path.realpath(k))}, key=len):
        # Every spelling the interpreter's paths use must exist in the new root,
        # whatever tree its target is in.
        if os.path.exists(p) and not _covered(_through_links(p, links), tops):
            binds.append((os.path.realpath(p), p, True))
            tops.append(p)
    binds += [("/dev/" + d, "/dev/" + d, True) for d in _DEVICES if os.path.exists("/dev/" + d)]
    binds.append(("/proc", "/proc", False))
    # Opened before the staging tmpfs covers /tmp: the interpreter may live there.
    fds = [os.open(src, os.O_PATH) for src, _, _ in binds]
    _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=0700")
    new = "/tmp/root"
    os.mkdir(new, 0o755)
    _mount("tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
    for link, target in links:
        os.symlink(target, new + link)
    # The fresh tmpfs first: a tree bound below /tmp (an interpreter there) must
    # land on it, not be covered by it.
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        os.makedirs(new + d, exist_ok=True)
        size = f"{tmpfs_mb}m" if d == "/tmp" else "4m"
        _mount("tmpfs", new + d, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={size},mode=1777")
    for fd, (_, path, read_only) in zip(fds, binds):
        _bind(fd, new + path, read_only)
        os.close(fd)
    for h in hide_paths:
        if os.path.isdir(new + h):
            flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV
            _mount("tmpfs", new + h, "tmpfs", flags, "size=4k,mode=0555")
    os.symlink("/proc/self/fd", new + "/dev/fd")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{new}/dev/{name}")
    os.makedirs(new + "/tmp/.gdpo_io", mode=0o700)  # only where memfd is refused (`_anon_file`)
    os.makedirs(new + "/tmp/work", mode=0o700)
    _enter(new, pivot)
    # The root's own tmpfs, now that everything is in place, read-only too.
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None)
    return "/tmp/work", "/tmp/.gdpo_io"


def _enter(new, pivot=True):
    """Make `new` the root.

    pivot_root(".", ".") and the old root detached (runc's way): no process here
    can walk or mount its way back. Where pivot_root is refused (the default
    seccomp profile of Docker and containerd, a root on rootfs, an unknown ABI),
    the new root is moved over "/" and entered with chroot, as switch_root does:
    the old root stays mounted under it, which only a process holding
    CAP_SYS_ADMIN or CAP_SYS_CHROOT could reach, and a test process holds neither
    (it drops to another uid, or drops every capability, before the program runs).
    """
    os.chdir(new)
    number = _PIVOT_ROOT.get((os.uname().machine, ctypes.sizeof(ctypes.c_void_p)))
    if pivot and number is not None and _libc.syscall(ctypes.c_long(number), b".", b".") == 0:
        if _libc.umount2(b".", _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"detaching the old root: {os.strerror(err)}")
    else:
        _mount(new, "/", None, _MS_MOVE, None)
        os.chroot(".")
    os.chdir("/")
