"""Host process environment for fast XLA:CPU steps: huge pages for XLA's buffers.

Why: every execution of a compiled program on the CPU backend allocates its
temporary buffers afresh (one allocation per program, tens to hundreds of MB
for a training step), and glibc serves allocations that large with a fresh
``mmap``. The kernel then zero-fills every 4 KiB page on first touch: the
benchmark RL step (docs/benchmarks.md) took ~150,000 minor page faults per
step, a tenth of its time. With glibc's ``glibc.malloc.hugetlb=1`` tunable,
malloc asks for transparent huge pages (``madvise``), and the same step takes
~300 faults.

A glibc tunable is read once, when the process starts, so it cannot be set
from Python for the running process: :func:`relaunch_with_cpu_tunables`
re-executes the current command line (same PID, same arguments, same
standard streams) with the tunable added to ``GLIBC_TUNABLES``. The CLIs
(``gdpo-train``, ``gdpo-sft``, ``gdpo-compare``) and the benchmarks call it
first thing; a notebook or script sets the variable itself before starting
Python: ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python ...``.

Those command lines re-execute earlier still: ``import gdpo_jax`` (which the
``experiments`` and ``benchmarks`` packages run first) calls
:func:`relaunch_entry_point` before it imports JAX, so the process that is about
to be replaced does not first pay for JAX's import (about a second of each CLI's
start). Their own call later finds the tunable set and returns.

Nothing happens (and nothing is re-executed) when the tunable is already set,
when ``GDPO_JAX_NO_RELAUNCH=1``, off Linux, inside a pytest run or an IPython
shell (a re-exec would restart the whole session), or when JAX has already started a
backend (a re-exec would then lose work). Numerics are unchanged: only where
the memory comes from differs.
"""

from __future__ import annotations

import os
import sys

__all__ = [
    "ENTRY_MODULES",
    "ENTRY_SCRIPTS",
    "HUGETLB_TUNABLE",
    "NO_RELAUNCH_ENV",
    "cpu_tunables_env",
    "entry_point",
    "relaunch_entry_point",
    "relaunch_with_cpu_tunables",
]

HUGETLB_TUNABLE = "glibc.malloc.hugetlb=1"
NO_RELAUNCH_ENV = "GDPO_JAX_NO_RELAUNCH"

# The command lines whose main calls relaunch_with_cpu_tunables (itself or through
# gdpo_jax.train.cli.run_config_main): `python -m <module>`, and the console scripts
# (setup.py), which run experiments.train / sft / compare_estimators.
# tests/test_hostenv.py keeps the list equal to the modules that call it. A list, not
# a rule such as "every experiments.* / benchmarks.* module": 23 of them do not
# relaunch (the planner, which never allocates a model's memory; the reports; the
# probes that start a child per setting), and the package cannot read their source
# at import (an installed gdpo_jax ships neither folder).
ENTRY_MODULES = frozenset(
    {
        "experiments.check_plan",
        "experiments.compare_estimators",
        "experiments.sft",
        "experiments.smollm2_demo",
        "experiments.train",
        "experiments.tune_microbatches",
        "benchmarks.bench_advantages",
        "benchmarks.bench_attention",
        "benchmarks.bench_decode_growth",
        "benchmarks.bench_longtail",
        "benchmarks.bench_math",
        "benchmarks.bench_matmul",
        "benchmarks.bench_model",
        "benchmarks.bench_prompt_sharing",
        "benchmarks.bench_prompt_slots",
        "benchmarks.bench_rl",
        "benchmarks.bench_sampler",
        "benchmarks.bench_sandbox",
        "benchmarks.bench_token_choice",
        "benchmarks.bench_top_k",
        "benchmarks.probe_bisect_chunks",
        "benchmarks.profile_decode",
        "benchmarks.profile_decode_ops",
        "benchmarks.profile_host",
        "benchmarks.profile_import",
        "benchmarks.profile_kernels",
        "benchmarks.profile_step_ops",
        "benchmarks.run_all",
    }
)
ENTRY_SCRIPTS = frozenset({"gdpo-train", "gdpo-sft", "gdpo-compare"})
# Interpreter options that take the next argument as their value.
_OPTIONS_WITH_VALUE = frozenset({"-X", "-W", "--check-hash-based-pycs"})


def cpu_tunables_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default os.environ) with the huge-page tunable added to
    GLIBC_TUNABLES (kept as is when it already names glibc.malloc.hugetlb)."""
    out = dict(os.environ if env is None else env)
    current = out.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" not in current:
        out["GLIBC_TUNABLES"] = f"{current}:{HUGETLB_TUNABLE}" if current else HUGETLB_TUNABLE
    return out


def _backend_started() -> bool:
    jax_mod = sys.modules.get("jax._src.xla_bridge")
    return bool(jax_mod is not None and getattr(jax_mod, "_backends", None))


def _in_ipython_shell() -> bool:
    """Whether an IPython shell or kernel runs this process. Not merely whether
    IPython was imported: flax.nnx imports it wherever it is installed (the [viz]
    extra), which had kept every script importing nnx from relaunching."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    return bool(get is not None and get() is not None)


def _interactive_or_stdin() -> bool:
    """A script read from stdin (`python - < f`, `python < f`) or an interactive session:
    re-run, the first found stdin consumed and ran nothing with status 0, and the
    second lost the session's variables."""
    return sys.argv[:1] in ([""], ["-"]) or bool(sys.flags.interactive) or hasattr(sys, "ps1")


def _in_pytest_run() -> bool:
    """Whether a pytest session runs this process: pytest imported *and* its
    session (PYTEST_VERSION) or per-test (PYTEST_CURRENT_TEST) variable set. Not
    merely pytest imported: a dependency importing it would otherwise silently
    keep every CLI and benchmark from relaunching (as IPython had, via flax.nnx)."""
    in_session = "PYTEST_VERSION" in os.environ or "PYTEST_CURRENT_TEST" in os.environ
    return "pytest" in sys.modules and in_session


def entry_point(argv: list[str]) -> bool:
    """Whether the interpreter command line `argv` (`sys.orig_argv`) runs one of
    ENTRY_MODULES (`python [options] -m <module> ...`) or ENTRY_SCRIPTS (a console
    script's path). A form this does not read (`python -um x`) answers False: that
    process relaunches later, from its main, as before."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return i + 1 < len(argv) and argv[i + 1] in ENTRY_MODULES
        if arg in _OPTIONS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith("-"):
            if arg in ("-c", "-"):
                return False
            i += 1
            continue
        return os.path.basename(arg) in ENTRY_SCRIPTS
    return False


def relaunch_entry_point() -> None:
    """`relaunch_with_cpu_tunables()` now when this process runs one of the command
    lines whose main would call it (:func:`entry_point`), with the same conditions.
    `import gdpo_jax` calls it before importing JAX."""
    if entry_point(list(getattr(sys, "orig_argv", []))):
        relaunch_with_cpu_tunables()


def relaunch_with_cpu_tunables() -> None:
    """Re-executes this process with huge pages for malloc, unless that is done,
    disabled (GDPO_JAX_NO_RELAUNCH=1), off Linux, inside a pytest run / an IPython shell / an
    interactive session, for a script read from stdin, or too late (a JAX backend is up).

    Returns only when no re-exec happens; otherwise the process image is
    replaced (os.execve: same PID, same argv, same open stdin/stdout/stderr).
    """
    # "false" / "no" / "off" keep it on as "0" does (any other value opted out, "false" too).
    off = os.environ.get(NO_RELAUNCH_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")
    if sys.platform != "linux" or off:
        return
    if "glibc.malloc.hugetlb" in os.environ.get("GLIBC_TUNABLES", "") or _backend_started():
        return
    if _in_pytest_run() or _in_ipython_shell() or _interactive_or_stdin():
        return
    env = cpu_tunables_env()
    # Loop guard: the child sees the tunable set and returns above; should the
    # variable be dropped on the way, NO_RELAUNCH stops a second re-exec.
    env[NO_RELAUNCH_ENV] = "1"
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    argv = list(getattr(sys, "orig_argv", []) or [sys.executable, *sys.argv])
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)
