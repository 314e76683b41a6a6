"""Runs a benchmark script's `--quick` mode in a fresh interpreter, for the
end-to-end tests of the profilers."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

from tests._quick_compile import without_quick_compile
from tests._subprocess import child_env


def run_quick(module: str, tmp_path: pathlib.Path) -> dict[str, Any]:
    """`python -m benchmarks.<module> --quick --out <tmp_path>/<module>.json` in a fresh
    interpreter (XLA reads a dump flag a script sets only before its backend starts),
    compiled as a benchmark runs: under XLA's defaults, not the suite's quick compile
    (its profiles' shares are the default build's); returns the JSON it wrote.

    The script gets a temp folder of its own (TMPDIR), which must be empty once it
    exits: a profiler's workdirs and checkpoints may not outlive it. torch's compile
    cache (`torchinductor_<user>`, made where a checkpoint is written through torch)
    is torch's own, kept between runs by design."""
    out = tmp_path / f"{module}.json"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    flags = without_quick_compile(os.environ.get("XLA_FLAGS", ""))
    env = child_env(TMPDIR=str(scratch), XLA_FLAGS=flags)
    subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--quick", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_"))
    assert not left, f"benchmarks.{module} left {left} in its temp folder"
    return json.loads(out.read_text())
