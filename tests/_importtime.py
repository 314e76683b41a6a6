"""The modules a command imports, read from `python -X importtime`: what a process
start pays for, checked without timing it."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = str(pathlib.Path(__file__).resolve().parent.parent)


def modules_imported(
    args: list[str], tmp_path: pathlib.Path, env_extra: dict[str, str] | None = None
) -> list[str]:
    """Each module `python -X importtime <args>` imported, once per import, across a
    re-exec (both process images write to the same stderr file); started as on a
    user's first run: no malloc tunable, the re-exec allowed, JAX on the CPU."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "GDPO_JAX_NO_RELAUNCH")
    }
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **(env_extra or {}))
    path = tmp_path / "importtime.txt"
    with open(path, "w") as err:
        subprocess.run(
            [sys.executable, "-X", "importtime", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            timeout=300,
        )
    lines = path.read_text().splitlines()
    return [ln.rsplit("|", 1)[1].strip() for ln in lines if ln.startswith("import time:")]
