"""Programs over several CPU devices run under XLA:CPU's ordered scheduler, set before
JAX starts (gdpo_jax/xla_cpu.py): with the default one the fused step deadlocked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gdpo_jax import xla_cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORDERED = xla_cpu.ORDERED_SCHEDULER
DEFAULT = f"--{xla_cpu.SCHEDULER_FLAG}=true"


@pytest.mark.parametrize(
    "flags, env, count",
    [
        ("", {}, 1),
        ("--xla_force_host_platform_device_count=8", {}, 8),
        # XLA parses the flags in order: the last count wins.
        (
            "--xla_force_host_platform_device_count=8 --xla_force_host_platform_device_count=1",
            {},
            1,
        ),
        ("", {"JAX_NUM_CPU_DEVICES": "4"}, 4),
        ("--xla_force_host_platform_device_count=2", {"JAX_NUM_CPU_DEVICES": "4"}, 2),
        ("", {"JAX_NUM_CPU_DEVICES": "x"}, 1),
    ],
)
def test_host_device_count_reads_the_flags_then_the_environment(flags, env, count):
    assert xla_cpu.host_device_count(flags, env) == count


@pytest.mark.parametrize(
    "flags, several_processes, added",
    [
        ("--xla_force_host_platform_device_count=8", False, True),
        ("--xla_force_host_platform_device_count=1", False, False),
        ("", False, False),  # one CPU device: its programs have no collectives to order
        ("", True, True),  # a CPU run joining a cluster
        (f"--xla_force_host_platform_device_count=8 {DEFAULT}", False, False),  # chosen: kept
        (f"--xla_force_host_platform_device_count=8 {ORDERED}", False, False),  # already there
    ],
)
def test_the_ordered_scheduler_is_added_only_for_several_devices_and_never_over_a_choice(
    monkeypatch, flags, several_processes, added
):
    monkeypatch.setattr(xla_cpu, "_backend_started", lambda: False)
    env = {"XLA_FLAGS": flags}
    assert xla_cpu.use_ordered_scheduler(several_processes=several_processes, environ=env) is added
    assert env["XLA_FLAGS"] == (f"{flags} {ORDERED}".strip() if added else flags)
    # Once a backend has started XLA has parsed the flags: nothing is changed.
    monkeypatch.setattr(xla_cpu, "_backend_started", lambda: True)
    env = {"XLA_FLAGS": flags}
    assert not xla_cpu.use_ordered_scheduler(several_processes=True, environ=env)
    assert env["XLA_FLAGS"] == flags


@pytest.mark.parametrize(
    "flags, env, pool",
    [
        ("--xla_force_host_platform_device_count=8", {}, "64"),
        ("--xla_force_host_platform_device_count=1", {}, None),  # no collectives
        ("", {}, None),
        ("", {"JAX_NUM_CPU_DEVICES": "4"}, "32"),
        ("--xla_force_host_platform_device_count=8", {"PJRT_NPROC": "3"}, "3"),  # chosen: kept
        ("--xla_force_host_platform_device_count=8", {"NPROC": "3"}, None),  # XLA reads NPROC
    ],
)
def test_the_pool_is_sized_only_for_several_devices_and_never_over_a_choice(
    monkeypatch, flags, env, pool
):
    monkeypatch.setattr(xla_cpu, "_backend_started", lambda: False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    env = {"XLA_FLAGS": flags, **env}
    chosen = "PJRT_NPROC" in env or "NPROC" in env
    assert xla_cpu.use_collective_pool(environ=env) is (pool is not None and not chosen)
    assert env.get("PJRT_NPROC") == pool
    # Never fewer threads than cores.
    assert xla_cpu.pool_threads(2, 2) == 16 and xla_cpu.pool_threads(2, 96) == 96
    # Once a backend has started the CPU client has its pool: nothing is changed.
    monkeypatch.setattr(xla_cpu, "_backend_started", lambda: True)
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert not xla_cpu.use_collective_pool(environ=env) and "PJRT_NPROC" not in env


def _python(args: list[str], xla_flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env = {k: v for k, v in env.items() if k not in ("PJRT_NPROC", "NPROC")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, XLA_FLAGS=xla_flags)
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "flags, ordered",
    [
        ("--xla_force_host_platform_device_count=4", True),
        (f"--xla_force_host_platform_device_count=4 {DEFAULT}", False),
        ("", False),
    ],
)
def test_xla_starts_with_the_ordered_scheduler_after_import_gdpo_jax(flags, ordered):
    """And with the pool sized for the devices' collectives: XLA's pool threads are
    named tf_XLAEigen (one per device, or per core if more, when left to XLA)."""
    code = (
        "import jax, gdpo_jax\n"  # jax imported first, as a notebook may: no backend yet
        "from gdpo_jax import compile_cache\n"
        "from benchmarks.probe_cpu_collectives_pool import pool_size\n"
        "print(jax.device_count(), compile_cache.ordered_cpu_scheduler(), pool_size())"
    )
    out = _python(["-c", code], flags)
    assert out.returncode == 0, out.stderr[-2000:]
    count = 4 if flags else 1
    cores = os.cpu_count() or 1
    pool = xla_cpu.pool_threads(4, cores) if flags else max(cores, 1)
    assert out.stdout.split() == [str(count), str(ordered), str(pool)]


def test_the_pool_setting_stays_in_its_process():
    """`import gdpo_jax` sets PJRT_NPROC for its own 4 devices; once the CPU client has
    read it, it leaves os.environ, and a one-device process started then gets XLA's
    own pool (one thread per core), not 32 threads. Before, every child inherited it."""
    child = (
        "from benchmarks.probe_cpu_collectives_pool import pool_size\n"
        "import jax\n"
        "print(jax.device_count(), pool_size())"
    )
    code = (
        "import os, subprocess, sys\n"
        "import gdpo_jax, jax\n"
        "before = os.environ.get('PJRT_NPROC')\n"
        "jax.devices()\n"
        "env = {**os.environ, 'XLA_FLAGS': ''}\n"
        f"out = subprocess.run([sys.executable, '-c', {child!r}], env=env, capture_output=True,"
        " text=True, check=True)\n"
        "print(before, os.environ.get('PJRT_NPROC'), out.stdout.strip())"
    )
    out = _python(["-c", code], "--xla_force_host_platform_device_count=4")
    assert out.returncode == 0, out.stderr[-2000:]
    cores = os.cpu_count() or 1
    assert out.stdout.split() == [str(xla_cpu.pool_threads(4, cores)), "None", "1", str(cores)]
    # A setting the user made is theirs: kept in os.environ after the start.
    code = "import os, gdpo_jax, jax\njax.devices()\nprint(os.environ.get('PJRT_NPROC'))"
    env_flags = "--xla_force_host_platform_device_count=4"
    chosen = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": ROOT,
            "XLA_FLAGS": env_flags,
            "PJRT_NPROC": "5",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert chosen.returncode == 0, chosen.stderr[-2000:]
    assert chosen.stdout.split() == ["5"]


@pytest.mark.slow
def test_the_fused_step_over_four_cpu_devices_runs_hundreds_of_times():
    # With XLA's default scheduler this run aborted after 43, 85 and 333 executions in
    # the probe's three runs (XLA's 40 s rendezvous wait ran out with the devices in
    # different all-reduces; docs/benchmarks/cpu_collectives_repeat_*.json).
    iters = 400
    worker = ["-m", "benchmarks.probe_cpu_collectives_repeat", "--worker", "0", "1", "0"]
    out = _python([*worker, str(iters)], "--xla_force_host_platform_device_count=4", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("step ") == iters


@pytest.mark.slow
def test_many_collectives_in_flight_do_not_starve_the_pool():
    """Four Python threads each run a program over 8 CPU devices whose 8 weights are
    all-gathered independently: on XLA's pool (a thread per device) the waiting
    all-gathers took every thread and the process aborted (docs/benchmarks/
    cpu_collectives_pool_*.json); on the pool `import gdpo_jax` sizes, it finishes."""
    worker = ["-m", "benchmarks.probe_cpu_collectives_pool", "--worker", "4", "40"]
    flags = (
        "--xla_force_host_platform_device_count=8 "
        "--xla_cpu_collective_call_terminate_timeout_seconds=20"
    )
    out = _python(worker, flags, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == '{"done": [40, 40, 40, 40]}'
