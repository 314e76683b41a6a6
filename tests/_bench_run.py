"""Runs a benchmark script's `--quick` mode in a fresh interpreter, for the
end-to-end tests of the profilers."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_quick(module: str, tmp_path: pathlib.Path) -> dict[str, Any]:
    """`python -m benchmarks.<module> --quick --out <tmp_path>/<module>.json` in a fresh
    interpreter (XLA reads a dump flag a script sets only before its backend starts);
    returns the JSON it wrote."""
    out = tmp_path / f"{module}.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--quick", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return json.loads(out.read_text())
