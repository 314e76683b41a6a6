"""A Python snippet run in a fresh interpreter with the repository importable: for tests
whose regression would hang (a quadratic regex), which then fail on the timeout instead
of stalling the suite."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
        env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"},
    )
