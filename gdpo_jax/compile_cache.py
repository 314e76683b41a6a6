"""JAX's persistent compilation cache, and the executables it must not serve.

XLA:CPU in jaxlib 0.10.2 can deadlock when it runs a program over several CPU
devices (`--xla_force_host_platform_device_count`) that was loaded from the
persistent cache. Every device's thread then waits in a collective's rendezvous,
but not all in the same one. Seen on the 8-device training step: device 0 waited
in an all-gather while devices 1-7 waited in an all-reduce. After 40 s
(`--xla_cpu_collective_call_terminate_timeout_seconds`) the process aborts; with
that timeout (and `--xla_cpu_collective_timeout_seconds`) at 300 s it waited 300 s
and aborted all the same: a deadlock, which longer timeouts do not cure.

Freshly compiled, the step ran every time under load: 5 of 5 runs of
tests/test_train_sharded.py on a 2-core machine kept busy by three spinning
processes. Loaded from the cache it aborted in 3 of 4 such runs, and in none
without the load. Fresh programs are not immune, only slower to meet it: run
many times, the fused step deadlocked after 43-333 executions (`xla_cpu.py`).

XLA:CPU's concurrency-optimized scheduler exposes it. With
`--xla_cpu_enable_concurrency_optimized_scheduler=false` in XLA_FLAGS (when the
cache was filled, too: XLA_FLAGS are part of the key) the loaded programs ran every
time under the same load, where nearly every loaded run aborted with the default
scheduler (`python -m benchmarks.probe_cpu_collectives_cache`; the committed counts
are in docs/limits.md). `import gdpo_jax` adds that flag when XLA_FLAGS give the
host several devices (`xla_cpu.use_ordered_scheduler`), so such runs keep the cache.

GPU and TPU collectives are not affected, and neither is a single CPU device.
A run on several CPU devices whose XLA started without the flag (JAX started
before gdpo_jax was imported, or XLA_FLAGS chose the default scheduler) compiles
its programs and neither reads nor writes the cache
(`cpu_collectives_compiled_fresh`), and warns once a process that its collectives
can deadlock, naming the flag (`warn_default_scheduler`). The test suite keeps its
multi-device CPU programs out of the cache under either scheduler (tests/conftest.py).

XLA parses XLA_FLAGS once, when the process's first backend starts; setting them
later (a notebook's `os.environ[...]`) changes nothing for that process's XLA. So
`cache_is_safe` reads the flags as they were then (`started_xla_flags`, recorded
by a backend-initialization hook), not the environment of the moment.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax
from jax._src import xla_bridge  # private (jax 0.10.2): the backend-initialization hook

# The XLA flag that keeps XLA:CPU collectives out of the deadlock (xla_cpu.py).
from gdpo_jax.xla_cpu import ORDERED_SCHEDULER, SCHEDULER_FLAG

__all__ = [
    "ORDERED_SCHEDULER",
    "cache_is_safe",
    "compiled_fresh_for_run",
    "cpu_collectives_compiled_fresh",
    "guarded",
    "ordered_cpu_scheduler",
    "run_devices",
    "started_xla_flags",
    "warn_default_scheduler",
]

log = logging.getLogger(__name__)
_told = False  # the cache-off line is logged once a process
_warned = False  # so is the scheduler warning


# XLA_FLAGS when this process's first backend started (None: not started yet).
_flags_at_start: str | None = None


def _record_flags(_backend: object) -> None:
    """Backend-initialization hook: keeps XLA_FLAGS as XLA parsed them, at the first
    backend's start (for backends started before this module was imported, JAX runs
    the hook at its import: the environment then, the best that is known)."""
    global _flags_at_start
    if _flags_at_start is None:
        _flags_at_start = os.environ.get("XLA_FLAGS", "")


xla_bridge.register_backend_initialization_hook(_record_flags)


def started_xla_flags() -> str:
    """The XLA_FLAGS this process's XLA runs with: those of the environment when its
    first backend started (starting the backends if none has). XLA parses them
    once, then; a later change of $XLA_FLAGS has no effect on this process."""
    if _flags_at_start is None:
        jax.devices()  # starts the backends; the hook records the flags
    return _flags_at_start or ""


def ordered_cpu_scheduler(xla_flags: str | None = None) -> bool:
    """Whether `xla_flags` (default: `started_xla_flags()`) turns XLA:CPU's
    concurrency-optimized scheduler off (the last
    `--xla_cpu_enable_concurrency_optimized_scheduler=` wins, as in XLA's own parsing)."""
    flags = started_xla_flags() if xla_flags is None else xla_flags
    value = None
    for token in flags.split():
        name, _, v = token.partition("=")
        if name == "--" + SCHEDULER_FLAG:
            value = v.lower()
    return value in ("false", "0")


def cache_is_safe(platform: str, num_devices: int, xla_flags: str | None = None) -> bool:
    """Whether an executable for `num_devices` devices of `platform` ("cpu",
    "gpu", "tpu") may be stored in and loaded from the persistent cache: always
    for accelerators and one device; for several CPU devices only when
    `xla_flags` (default: `started_xla_flags()`) carries `ORDERED_SCHEDULER`."""
    return platform != "cpu" or num_devices <= 1 or ordered_cpu_scheduler(xla_flags)


def run_devices(num_devices: int) -> int:
    """How many devices a run with `config.mesh.num_devices` (0: all) spans."""
    return len(jax.devices()[: num_devices or None])


@contextlib.contextmanager
def cpu_collectives_compiled_fresh(num_devices: int) -> Iterator[bool]:
    """Within the block, the persistent cache is off when this process runs
    XLA:CPU programs over `num_devices` > 1 devices (yields whether it turned
    it off); the setting is restored on exit."""
    from jax.experimental.compilation_cache import compilation_cache

    on = bool(jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir)
    unsafe = not cache_is_safe(jax.default_backend(), num_devices)
    if unsafe:
        warn_default_scheduler(num_devices)
    off = on and unsafe
    if off:
        global _told
        if not _told:  # once a process: a notebook's train_step() in a loop enters here often
            _told = True
            log.info(
                "persistent compilation cache off for this run: XLA:CPU programs over %d "
                "devices loaded from it can deadlock in their collectives; add %s to "
                "XLA_FLAGS to keep it (gdpo_jax/compile_cache.py)",
                num_devices,
                ORDERED_SCHEDULER,
            )
        jax.config.update("jax_enable_compilation_cache", False)
        compilation_cache.reset_cache()  # the on/off is read once per process
    try:
        yield off
    finally:
        if off:
            jax.config.update("jax_enable_compilation_cache", True)
            compilation_cache.reset_cache()


def warn_default_scheduler(num_devices: int) -> None:
    """Logs, once a process, that this process's XLA:CPU runs programs over
    `num_devices` devices under its concurrency-optimized scheduler (JAX started
    before gdpo_jax was imported, or XLA_FLAGS chose it), and the flag that avoids
    the collectives' deadlock (xla_cpu.py). A warning, not an error: XLA has parsed
    its flags already, and a choice made in XLA_FLAGS is the user's."""
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "XLA:CPU runs these programs over %d devices under its concurrency-optimized "
            "scheduler, whose collectives can deadlock (the fused step stopped after 43-333 "
            "executions in 5 of 6 probe runs: docs/limits.md); start the process with %s in "
            "XLA_FLAGS, or import gdpo_jax before JAX starts and it adds it",
            num_devices,
            ORDERED_SCHEDULER,
        )


def compiled_fresh_for_run(cfg) -> contextlib.AbstractContextManager[bool]:
    """`cpu_collectives_compiled_fresh` over the devices a run of `cfg` spans
    (`config.mesh.num_devices`): the block every run's build and loop go in."""
    return cpu_collectives_compiled_fresh(run_devices(cfg.mesh.num_devices))


_F = TypeVar("_F", bound=Callable[..., Any])


def guarded(method: _F) -> _F:
    """Method decorator for a run's classes (`Trainer`, `SFT`): the method runs in
    `compiled_fresh_for_run(cfg)`, `cfg` being `self.cfg`, or for `__init__` its
    first argument. So `Trainer(cfg).run()`, or a notebook's own `train_step` loop,
    is guarded as `train(cfg)` is; nested guards do nothing more."""

    @functools.wraps(method)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        cfg = getattr(self, "cfg", None)
        if cfg is None:
            cfg = args[0] if args else kwargs.get("cfg")
        try:
            num_devices = int(cfg.mesh.num_devices)
        except (AttributeError, KeyError, TypeError, ValueError):
            # No usable setting: the method's own validation names the field.
            return method(self, *args, **kwargs)
        with cpu_collectives_compiled_fresh(run_devices(num_devices)):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
