"""Child interpreters for tests: the environment every test's subprocess starts with
(`child_env`), and a Python snippet run with it (`run_python`), for tests whose
regression would hang (a quadratic regex), which then fail on the timeout instead of
stalling the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a user's first start has not set: the malloc tunable, and the re-exec's opt-out
# (gdpo_jax/hostenv.py), which a test's own process may hold.
FIRST_RUN_UNSET = ("GLIBC_TUNABLES", "GDPO_JAX_NO_RELAUNCH")


def child_env(*, drop: Iterable[str] = (), first_run: bool = False, **extra: str) -> dict[str, str]:
    """This process's environment for a child interpreter: without the variables in
    `drop` (and FIRST_RUN_UNSET when `first_run`: started as on a user's first run, no
    malloc tunable and gdpo_jax's re-exec allowed), JAX on the CPU (libtpu's lock left
    alone), the repository importable (PYTHONPATH), then `extra` set."""
    gone = {*drop, *(FIRST_RUN_UNSET if first_run else ())}
    env = {k: v for k, v in os.environ.items() if k not in gone}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    env.update(extra)
    return env


def run_python(
    code: str, *, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """`python -c code` (JAX on CPU), stdin fed from `stdin`; raises TimeoutExpired."""
    return subprocess.run(
        [sys.executable, "-c", code],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
    )
