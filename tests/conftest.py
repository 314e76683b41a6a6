"""Test session set-up: 8 fake CPU devices so sharding tests run anywhere.

XLA reads the flag once, when the backend starts, so it is set here, before any
test module imports jax.
"""

import os

from tests._quick_compile import quick_compile_flags, without_quick_compile

# XLA:CPU's quick compile (LLVM -O0, legacy emitters): the suite is compile-bound, and
# this cuts its time by about 40%. GDPO_TEST_XLA_DEFAULTS=1 keeps XLA's defaults
# (tests/_quick_compile.py). Flags inherited from a parent (xdist's controller) are
# replaced, not doubled.
os.environ["XLA_FLAGS"] = " ".join(
    f
    for f in (
        without_quick_compile(os.environ.get("XLA_FLAGS", "")),
        "--xla_force_host_platform_device_count=8",
        quick_compile_flags(),
    )
    if f
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu (the [aot] extra) is only a compiler here, with no TPU chip to guard: let
# concurrent processes (pytest-xdist workers, a planner run) each load it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent XLA compilation cache for the session's processes (both xdist workers
# and every CLI subprocess a test starts): the suite compiles the same small programs
# many times over (tiny_cpu's step and sampler in each CLI, resume and multi-process
# test). The key covers the HLO, the compile options, XLA_FLAGS and the jax version, so
# a hit is the same executable; a size limit turns on the cache's file lock (concurrent
# writers). Entries compiled for an abstract TPU / GPU target (the planner) cannot be
# loaded back on this CPU: JAX warns and compiles again (see pytest.ini).
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax"),
)
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 * 2**30))


# JAX's start without the CUDA plugin's driver-probe lines, as in every CLI
# (gdpo_jax/quiet_start.py), and XLA:CPU's ordered scheduler for the 8 devices
# (gdpo_jax/xla_cpu.py): before anything below imports jax.
import gdpo_jax  # noqa: E402, F401


def _cache_safe_programs_only() -> None:
    """This process's programs over several CPU devices bypass the shared cache,
    under either XLA:CPU scheduler: with the default one a program loaded from it
    can deadlock (gdpo_jax/compile_cache.py), and with the ordered one (which
    `import gdpo_jax` above gives the suite) a clean-clone run of the suite that
    cached them aborted once in the sampler's 8-device decode. A run that compiled
    them fresh aborted there too: XLA:CPU's thread pool filled with waiting
    collectives, which `import gdpo_jax` now sizes against (gdpo_jax/xla_cpu.py).
    Until a run shows cached programs safe beside that, they stay out of the cache.

    JAX offers no per-program switch, so the (private, jax 0.10.2) cache-key
    function answers "no key" for them, as it does with the cache off: compiled,
    never stored. The CLIs a test starts guard themselves
    (`compile_cache.guarded` on `Trainer` / `SFT`)."""
    import numpy as np
    from jax._src import compiler

    key = compiler._get_cache_key

    def safe_key(options, backend, computation, devices, *args, **kwargs):
        if backend.platform == "cpu" and int(np.size(devices)) > 1:
            return None
        return key(options, backend, computation, devices, *args, **kwargs)

    compiler._get_cache_key = safe_key


_cache_safe_programs_only()


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked `xla_defaults` compare two programs' bits, which XLA's quick
    settings may round differently (tests/_quick_compile.py): skipped under them;
    `tests/test_quick_compile.py` runs them under XLA's defaults."""
    if not quick_compile_flags():
        return
    import pytest

    skip = pytest.mark.skip(reason="under XLA's defaults only: tests/test_quick_compile.py")
    for item in items:
        if item.get_closest_marker("xla_defaults"):
            item.add_marker(skip)
