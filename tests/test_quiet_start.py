"""A process's JAX start drops only the CUDA stub's driver-probe lines from stderr."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from gdpo_jax.quiet_start import drop_driver_probe_lines
from gdpo_jax.scale import targets as targets_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTICE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
PROBE = b"I0000 00:00:1.2 31165 cudart_stub.cc:31] Could not find cuda drivers on your machine.\n"


def _run(code: str, env: dict[str, str], cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, timeout=120
    )


def test_drop_keeps_every_other_line_in_order():
    data = b"first\n" + NOTICE + PROBE + b"E0000 a real error\n" + NOTICE + PROBE + b"last"
    assert drop_driver_probe_lines(data) == b"first\nE0000 a real error\nlast"
    assert drop_driver_probe_lines(b"") == b""


@pytest.mark.skipif(
    not targets_lib.has_module("jax_plugins.xla_cuda12"), reason="no CUDA plugin: no probe lines"
)
def test_cli_start_has_no_probe_lines_and_the_plain_import_has():
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    env.pop("GDPO_JAX_VERBOSE_START", None)
    code = "import experiments.train, jax, sys; jax.devices(); print('mine', file=sys.stderr)"
    quiet = _run(code, env)
    assert quiet.returncode == 0, quiet.stderr.decode()[-2000:]
    assert b"cudart_stub" not in quiet.stderr and b"InitializeLog" not in quiet.stderr
    assert quiet.stderr.endswith(b"mine\n")
    # The same start without the filter prints them here (so the check above can fail).
    loud = _run(code, {**env, "GDPO_JAX_VERBOSE_START": "1"})
    if b"cudart_stub" not in loud.stderr:
        pytest.skip("this machine's CUDA stub prints nothing (a GPU driver is present)")
    assert loud.stderr.count(b"cudart_stub") >= 4 and loud.stderr.endswith(b"mine\n")


def test_other_import_output_comes_back_in_order(tmp_path):
    """A stand-in `jax` that writes to descriptor 2 and to sys.stderr: both come back,
    the probe lines do not."""
    fake = tmp_path / "jax"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        textwrap.dedent(
            f"""
            import os, sys
            os.write(2, b"keep me\\n" + {NOTICE!r} + {PROBE!r})
            print("python line", file=sys.stderr)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    env.pop("JAX_PLATFORMS", None)  # no plugin registration: the stand-in has none
    env.pop("GDPO_JAX_VERBOSE_START", None)
    out = _run("import gdpo_jax, sys; assert 'jax' in sys.modules", env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stderr == b"keep me\npython line\n"
