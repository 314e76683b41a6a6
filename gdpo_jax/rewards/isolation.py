"""Sandbox isolation: which mode this machine allows, probed once per process.

  mode          who       network  pid ns  own root  other uid  fork bomb bound by
  "namespaces"  root      none     yes     yes       yes        per-run uid + RLIMIT_NPROC
  "userns"      non-root  none     yes     yes       no         RLIMIT_NPROC (ns-local count)
  "setuid"      root      host     no      no        yes        per-run uid + RLIMIT_NPROC
  "rlimits"     non-root  host     no      no        no         RLIMIT_NPROC, all user's tasks

"own root" (`Isolation.private_tmp`): a minimal root with a fresh /tmp.

"setuid" and "rlimits" (network reachable) are opt-in (`allow_weak`, config
rewards.sandbox.allow_weak). Root is refused "rlimits": Linux exempts uid 0
from RLIMIT_NPROC, so a test process left as root could fork without bound;
"setuid" is the same mode with a per-run uid. Root is refused "userns" too: its
namespace's root would be the host's root (`unshare --map-root-user` maps uid 0
to the caller's uid, 0), which owns root's files and /proc/sys however many
capabilities the program drops: it could write kernel.core_pattern (code run as
the host's root) or chmod the interpreter through /proc/self/exe. The runner is
gdpo_jax.rewards.sandbox (`run_program`), which re-exports these names.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import subprocess

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
WEAK_MODES = ("setuid", "rlimits")  # generated code reaches the network: opt-in only
log = logging.getLogger("gdpo_jax.sandbox")


@dataclasses.dataclass(frozen=True)
class Isolation:
    mode: str
    network_isolated: bool
    pid_namespace: bool
    private_tmp: bool
    uid_drop: bool
    note: str = ""


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
def isolation(mode: str = "auto", allow_weak: bool = False) -> Isolation:
    """The strongest isolation this machine allows (probed once), or `mode` if it works.

    "auto" never falls back to a WEAK_MODES mode unless allow_weak; any mode
    but "namespaces" is logged as a warning naming what it lacks.
    """
    if mode not in ("auto",) + MODES:
        raise ValueError(f"sandbox isolation mode must be 'auto' or one of {MODES}, got {mode!r}")
    root = os.geteuid() == 0
    unshare = shutil.which("unshare")
    avail = {"rlimits": not root, "setuid": root}
    if unshare:
        avail["namespaces"] = root and _probe([unshare, *_NS_FLAGS, "true"])
        cmd = [unshare, "--user", "--map-root-user", *_NS_FLAGS, "true"]
        avail["userns"] = not root and _probe(cmd)
    if mode == "auto":
        mode = next(m for m in MODES if avail.get(m))
        if mode in WEAK_MODES and not allow_weak:
            raise RuntimeError(
                f"sandbox: the strongest isolation this machine allows is {mode!r} "
                f"({_build(mode, root).note}), too weak for untrusted generated code. "
                "Run as root where `unshare` works (namespaces), or as a non-root user where "
                "unprivileged user namespaces are enabled (userns), or accept it with "
                "--config.rewards.sandbox.allow_weak=True (RewardSpec kwargs allow_weak=True)."
            )
    elif mode == "rlimits" and root:
        raise RuntimeError(
            "sandbox: isolation 'rlimits' is refused as root: Linux exempts uid 0 from "
            "RLIMIT_NPROC, so generated code could fork without bound. Use 'setuid' (the "
            "same limits with a per-run uid) or 'namespaces'."
        )
    elif mode == "userns" and root:
        raise RuntimeError(
            "sandbox: isolation 'userns' is refused as root: its namespace's root is the "
            "host's root, which owns /proc/sys and root's files (a way out of the sandbox). "
            "Use 'namespaces' (root with `unshare`) or 'setuid'."
        )
    elif not avail.get(mode):
        raise RuntimeError(
            f"sandbox isolation {mode!r} is not available on this machine "
            f"(available: {[m for m in MODES if avail.get(m)]})"
        )
    iso = _build(mode, root)
    if mode != "namespaces":
        log.warning(
            "SANDBOX IS WEAKER THAN 'namespaces': running untrusted generated code in mode %r: %s",
            mode,
            iso.note,
        )
    return iso
