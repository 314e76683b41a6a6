"""JAX's start without the CUDA plugin's driver-probe lines on a machine with no GPU.

Why: with the CUDA plugin installed (the ``aot`` extra, which the planner
compiles GPU targets with), every process that imports JAX on a machine
without an NVIDIA driver printed eight lines to stderr before its own first
line::

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.

three times while ``jax._src.lib`` loads the plugin's kernels, once more when
the plugin registers. They come from C++ static initializers writing to file
descriptor 2, so neither Python's logging nor ``TF_CPP_MIN_LOG_LEVEL`` reaches
them. :func:`import_jax` imports JAX (and, when ``JAX_PLATFORMS`` names the
platforms, registers its plugins, which starts no backend) with descriptor 2
sent to a temporary file, then writes back everything it caught except those
line pairs: any other message, a warning or a traceback's text, comes out
as it was, in order. On a machine with a GPU driver the stub prints nothing
and nothing is dropped.

The packages' ``__init__`` (``gdpo_jax``, ``experiments``, ``benchmarks``) call
it first, so every CLI and benchmark (``python -m experiments.train``, the
``gdpo-*`` commands) starts quiet. Nothing happens when JAX is already
imported or ``GDPO_JAX_VERBOSE_START=1``.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile

__all__ = ["drop_driver_probe_lines", "import_jax"]

# The two lines of each probe message: absl's pre-init notice and the probe's own.
_PROBE_LINES = (b"cudart_stub.cc", b"All log messages before absl::InitializeLog() is called")


def drop_driver_probe_lines(data: bytes) -> bytes:
    """`data` (stderr's bytes) without the CUDA stub's probe lines and absl's
    pre-init notice; every other line kept, in order, with its line ending."""
    lines = data.splitlines(keepends=True)
    return b"".join(line for line in lines if not any(p in line for p in _PROBE_LINES))


def import_jax() -> None:
    """Import JAX with the probe lines dropped from descriptor 2 (see the module doc)."""
    if "jax" in sys.modules or os.environ.get("GDPO_JAX_VERBOSE_START") == "1":
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (AttributeError, OSError, ValueError):  # no descriptor 2 (an embedded interpreter)
        importlib.import_module("jax")
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            importlib.import_module("jax")
            if os.environ.get("JAX_PLATFORMS"):
                # The plugins' registration (jax 0.10.2's private entry; what the
                # first backend call runs, idempotent). Only when the platforms are
                # fixed by the environment: the CUDA plugin reads them once, here, to
                # decide whether to check its CUDA versions.
                from jax._src import xla_bridge

                xla_bridge._discover_and_register_pjrt_plugins()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = drop_driver_probe_lines(caught.read())
            while kept:  # os.write may take part of it
                kept = kept[os.write(2, kept) :]
