"""The modules a command imports, read from `python -X importtime`: what a process
start pays for, checked without timing it."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from tests._subprocess import ROOT, child_env


def modules_imported(
    args: list[str], tmp_path: pathlib.Path, env_extra: dict[str, str] | None = None
) -> list[str]:
    """Each module `python -X importtime <args>` imported, once per import, across a
    re-exec (both process images write to the same stderr file); started as on a
    user's first run: no malloc tunable, the re-exec allowed, JAX on the CPU."""
    env = child_env(first_run=True, **(env_extra or {}))
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
