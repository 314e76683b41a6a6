"""gdpo_jax/hostenv.py: the CLIs' re-exec with glibc's huge-page malloc tunable.

Each case runs a fresh interpreter (a re-exec replaces the process), checks what
the re-executed process sees, and that the tunable really changes XLA:CPU's page
faults (the reason it exists).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tests._importtime import modules_imported
from tests._subprocess import child_env

ROOT = str(pathlib.Path(__file__).resolve().parent.parent)
PROBE = (
    "import json, os, sys\n"
    "from gdpo_jax.hostenv import relaunch_with_cpu_tunables\n"
    "{before}\n"
    "relaunch_with_cpu_tunables()\n"
    "print(json.dumps({{'tunables': os.environ.get('GLIBC_TUNABLES'), 'argv': sys.argv[1:],"
    " 'pid': os.getpid()}}))\n"
)


def _probe(env_extra: dict[str, str], before: str = "", drop=("GLIBC_TUNABLES",)) -> dict:
    env = child_env(drop=(*drop, "GDPO_JAX_NO_RELAUNCH"), **env_extra)
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before), "--flag=1", "two words"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, out.stdout  # the re-exec prints once, not twice
    return json.loads(lines[0])


def test_relaunch_adds_the_tunable_and_keeps_the_command_line():
    got = _probe({})
    assert got["tunables"] == "glibc.malloc.hugetlb=1"
    assert got["argv"] == ["--flag=1", "two words"]


@pytest.mark.parametrize("value", ["0", "false", "No", "off"])
def test_relaunch_when_the_opt_out_says_no(value):
    # GDPO_JAX_NO_RELAUNCH=false opted out: any value but "" and "0" did.
    assert _probe({"GDPO_JAX_NO_RELAUNCH": value})["tunables"] == "glibc.malloc.hugetlb=1"


def test_relaunch_keeps_existing_tunables():
    got = _probe({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, drop=())
    assert got["tunables"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


@pytest.mark.parametrize(
    "env_extra, before",
    [
        ({"GDPO_JAX_NO_RELAUNCH": "1"}, ""),  # opted out
        ({}, "import jax; jax.devices()"),  # too late: a backend is up
    ],
)
def test_no_relaunch_when_disabled_or_too_late(env_extra, before):
    assert _probe(env_extra, before)["tunables"] is None


def test_relaunch_after_importing_ipython_but_not_inside_a_shell():
    # flax.nnx imports IPython wherever it is installed, so "IPython imported" must
    # not count as "inside IPython": bench_sampler and five other benchmarks did not
    # relaunch. A live shell (get_ipython() answers) still keeps the process.
    pytest.importorskip("IPython")
    assert _probe({}, "import flax.nnx")["tunables"] == "glibc.malloc.hugetlb=1"
    shell = "import IPython; IPython.get_ipython = lambda: object()"
    assert _probe({}, shell)["tunables"] is None


def test_relaunch_after_importing_pytest_but_not_inside_a_pytest_run():
    # "pytest imported" must not count as "pytest runs this process": a dependency
    # importing pytest would silently keep the CLIs from relaunching. This test
    # runs under pytest, so its session variables are dropped for the first probe.
    session = ("GLIBC_TUNABLES", "PYTEST_VERSION", "PYTEST_CURRENT_TEST")
    assert _probe({}, "import pytest", drop=session)["tunables"] == "glibc.malloc.hugetlb=1"
    assert _probe({"PYTEST_VERSION": "9"}, "import pytest", drop=session)["tunables"] is None


def test_no_relaunch_for_a_script_from_stdin():
    # `python - < script`: the re-exec found stdin consumed, ran nothing and exited 0, so
    # the script's work after the relaunch never happened and the caller saw success.
    env = {k: v for k, v in child_env(first_run=True).items() if not k.startswith("PYTEST_")}
    for argv in ([sys.executable, "-"], [sys.executable]):
        out = subprocess.run(
            argv,
            input=PROBE.format(before="") + "sys.exit(5)\n",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 5, (argv, out.stdout, out.stderr)  # the script ran to its end
        (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        assert json.loads(line)["tunables"] is None


_FAULTS = (
    "import resource, jax, jax.numpy as jnp\n"
    "f = jax.jit(lambda x: (jnp.outer(x, x) * 2.0).sum(axis=0))\n"  # a 256 MB temporary
    "x = jnp.ones((8192,), jnp.float32); f(x).block_until_ready()\n"
    "r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
    "for _ in range(3): f(x).block_until_ready()\n"
    "print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 3)\n"
)


def _thp_available() -> bool:
    try:
        mode = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[never]" not in mode


@pytest.mark.skipif(not _thp_available(), reason="transparent huge pages are off here")
def test_tunable_cuts_xla_cpu_page_faults():
    def faults(tunables: str | None) -> float:
        env = child_env(drop=("GLIBC_TUNABLES",), GDPO_JAX_NO_RELAUNCH="1")
        if tunables:
            env["GLIBC_TUNABLES"] = tunables
        out = subprocess.run(
            [sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return float(out.stdout.strip().splitlines()[-1])

    plain, huge = faults(None), faults("glibc.malloc.hugetlb=1")
    # 4 KiB pages: tens of thousands of faults per call; 2 MiB pages: hundreds.
    assert plain > 10 * max(huge, 1.0), (plain, huge)


def test_every_benchmark_and_profiler_main_relaunches_with_the_tunable():
    # docs/benchmarks.md: each bench_* / profile_* script's __main__ re-executes with the
    # tunable (bench_sandbox, bench_math and bench_attention once did not); profile_step,
    # profile_ref and profile_guard set it per child process instead (common.run_child).
    import inspect

    from benchmarks import common

    scripts = sorted(pathlib.Path(ROOT, "benchmarks").glob("*.py"))
    mains = [
        p
        for p in scripts
        if p.name.startswith(("bench_", "profile_")) and '__name__ == "__main__"' in p.read_text()
    ]
    assert len(mains) >= 15
    per_child = {p.name for p in mains if "common.run_child(" in p.read_text()}
    assert {"profile_step.py", "profile_ref.py", "profile_guard.py"} <= per_child
    # In main() or under __main__ (a library import of the module never re-executes).
    missing = [
        p.name
        for p in mains
        if p.name not in per_child and "relaunch_with_cpu_tunables()" not in p.read_text()
    ]
    assert not missing, missing
    # A child process gets the tunable unless its caller turns it off.
    assert inspect.signature(common.run_child).parameters["hugetlb"].default is True
    assert "cpu_tunables_env(" in inspect.getsource(common.run_child)


def test_a_cli_relaunches_before_it_imports_jax(tmp_path):
    """`python -m experiments.train` re-executes from `import gdpo_jax`, before JAX's
    import: the process image it replaces imported gdpo_jax.hostenv and not JAX, so
    JAX is imported once in all (it was twice, about a second of each CLI's start)."""
    cmd = ["-m", "experiments.train", "--config=configs/tiny_cpu.py"]
    mods = modules_imported([*cmd, "--config.algo.group_size=-1"], tmp_path)
    assert mods.count("gdpo_jax.hostenv") == 2, "no re-exec"
    assert mods.count("jax._src.core") == 1
    # A command line that is not an entry point imports all in one process image.
    mods = modules_imported(["-c", "import gdpo_jax"], tmp_path)
    assert mods.count("gdpo_jax.hostenv") == 1 and mods.count("jax._src.core") == 1


@pytest.mark.parametrize(
    "argv, want",
    [
        (["python", "-m", "experiments.train", "--config=x.py"], True),
        (["python", "-u", "-X", "importtime", "-m", "benchmarks.bench_rl"], True),
        (["python", "-W", "ignore", "-m", "benchmarks.run_all", "--quick"], True),
        (["/v/bin/python", "/v/bin/gdpo-train", "--config=x.py"], True),
        (["python", "/v/bin/gdpo-compare"], True),
        (["python", "-m", "experiments.plan"], False),  # its main does not relaunch
        (["python", "-m", "benchmarks.profile_step"], False),  # per child process
        (["python", "-c", "import gdpo_jax", "-m", "experiments.train"], False),
        (["python", "train.py"], False),
        (["python", "-m"], False),
        (["python"], False),
        ([], False),
    ],
)
def test_entry_points_read_from_the_command_line(argv, want):
    from gdpo_jax import hostenv

    assert hostenv.entry_point(argv) is want


def test_the_entry_points_are_the_mains_that_relaunch():
    """hostenv.ENTRY_MODULES is every experiments/benchmarks module whose code calls
    relaunch_with_cpu_tunables() or runs through cli.run_config_main (which calls it),
    and ENTRY_SCRIPTS the console scripts, whose targets all relaunch."""
    from gdpo_jax import hostenv

    calls = {
        f"{p.parent.name}.{p.stem}"
        for top in ("experiments", "benchmarks")
        for p in pathlib.Path(ROOT, top).glob("*.py")
        if "relaunch_with_cpu_tunables()" in p.read_text()
        or "cli.run_config_main(main" in p.read_text()
    }
    assert hostenv.ENTRY_MODULES == calls
    setup = pathlib.Path(ROOT, "setup.py").read_text()
    scripts = {
        line.split('"')[1].split("=")[0]: line.split("=")[1].split(":")[0]
        for line in setup.splitlines()
        if line.strip().startswith('"gdpo-')
    }
    assert set(scripts) == hostenv.ENTRY_SCRIPTS
    assert set(scripts.values()) <= hostenv.ENTRY_MODULES
