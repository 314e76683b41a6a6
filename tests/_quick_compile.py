"""XLA:CPU's quick-compile settings for the suite's many small programs.

The suite's time is mostly XLA:CPU compiling: over a thousand tests each build a
step, a sampler or a model of a few layers, run it a few times and compare numbers.
LLVM at `-O0` (`--xla_backend_optimization_level=0`) with XLA's legacy elementwise
emitters (`--xla_cpu_use_fusion_emitters=false`) compiles those programs about twice
as fast; the code is slower, which a test's few executions do not feel
(docs/testing.md has the measured suite runs).

The two settings round differently in the last bits: the legacy emitters fuse some
reductions differently, and at `-O0` LLVM contracts no multiply-add into an FMA
(`x * 1.5 + 2` over 4,096 f32 values differs from the default build in 753 of them).
So a test that asks two programs for the same bits compiles both in one process
(under one setting), and a reference computed outside JAX carries a tolerance that
covers either.

The library, its CLIs and the benchmarks keep XLA's defaults. Only the suite's
processes get these flags (conftest.py; the CLIs a test starts inherit them), and the
benchmarks a test starts as scripts (`tests/_bench_run.py`) are run without them.
`GDPO_TEST_XLA_DEFAULTS=1` runs the whole suite under XLA's defaults;
`tests/test_quick_compile.py` runs the core parity tests so in every suite run.

A leaf: imports neither JAX nor gdpo_jax (conftest reads it before JAX starts).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["DEFAULTS_ENV", "QUICK_COMPILE", "quick_compile_flags", "without_quick_compile"]

DEFAULTS_ENV = "GDPO_TEST_XLA_DEFAULTS"
QUICK_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def quick_compile_flags(environ: Mapping[str, str] | None = None) -> str:
    """The XLA_FLAGS the suite's processes add: `QUICK_COMPILE`, or nothing when
    `environ[DEFAULTS_ENV]` (default os.environ) is "1"."""
    env = os.environ if environ is None else environ
    return "" if env.get(DEFAULTS_ENV) == "1" else QUICK_COMPILE


def without_quick_compile(xla_flags: str) -> str:
    """`xla_flags` with `QUICK_COMPILE`'s flags taken out (each, wherever it stands)."""
    quick = set(QUICK_COMPILE.split())
    return " ".join(f for f in xla_flags.split() if f not in quick)
