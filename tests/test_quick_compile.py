"""The suite compiles under XLA:CPU's quick settings (tests/_quick_compile.py); the core
parity tests also run under XLA's defaults, the build users run, in a child pytest."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests._quick_compile import (
    DEFAULTS_ENV,
    QUICK_COMPILE,
    quick_compile_flags,
    without_quick_compile,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The f32 parity tests of the core maths, the fused step, token choice and the HF
# model ports: each compares two programs, or one with a reference outside JAX.
DEFAULTS_RUN = (
    "tests/test_losses.py",
    "tests/test_logprobs.py",
    "tests/test_token_choice.py",
    "tests/test_models_hf.py",
    "tests/test_advantages.py::test_matches_reference_jitted",
    "tests/test_advantages.py::test_sharded_equals_unsharded",
    "tests/test_train_step.py::test_step_equals_unfused_reference",
)


def test_the_tests_kept_to_xlas_defaults_are_in_the_defaults_run():
    """A test marked `xla_defaults` is skipped under the quick settings, so its file
    must be in the run under XLA's defaults, or it would run nowhere."""
    marked = set()
    for name in sorted(os.listdir(os.path.join(ROOT, "tests"))):
        if name.startswith("test_") and name.endswith(".py") and name != "test_quick_compile.py":
            with open(os.path.join(ROOT, "tests", name)) as f:
                if "@pytest.mark.xla_defaults" in f.read():
                    marked.add(f"tests/{name}")
    assert "tests/test_token_choice.py" in marked
    assert marked <= set(DEFAULTS_RUN), marked - set(DEFAULTS_RUN)


def test_the_flags_come_and_go_as_asked():
    assert quick_compile_flags({}) == QUICK_COMPILE
    assert quick_compile_flags({DEFAULTS_ENV: "0"}) == QUICK_COMPILE
    assert quick_compile_flags({DEFAULTS_ENV: "1"}) == ""
    flags = f"--a=1 {QUICK_COMPILE} --xla_force_host_platform_device_count=8 {QUICK_COMPILE}"
    assert without_quick_compile(flags) == "--a=1 --xla_force_host_platform_device_count=8"
    assert without_quick_compile("") == ""


@pytest.mark.skipif(os.environ.get(DEFAULTS_ENV) == "1", reason="the suite runs XLA's defaults")
def test_this_process_compiles_at_o0():
    """XLA received the flags: at -O0 LLVM fuses no multiply-add, so `x * 1.5 + 2` rounds
    twice, as NumPy's f32 does (XLA's default build contracts it into one FMA where
    the CPU has one: 754 of these 4,096 values differ then)."""
    x = np.random.default_rng(0).normal(size=4096).astype(np.float32)
    got = np.asarray(jax.jit(lambda x: x * 1.5 + 2)(x))
    np.testing.assert_array_equal(got, x * np.float32(1.5) + np.float32(2))
    assert os.environ["XLA_FLAGS"].count("--xla_backend_optimization_level=0") == 1


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(DEFAULTS_ENV) == "1", reason="the suite runs XLA's defaults")
def test_the_core_parity_tests_pass_under_xlas_defaults():
    """The quick settings round differently in the last bits: the parity tests that
    hold the maths to a reference run once more as users compile, in a child pytest."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env[DEFAULTS_ENV] = "1"
    env["XLA_FLAGS"] = without_quick_compile(env.get("XLA_FLAGS", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    out = subprocess.run(
        [*cmd, *DEFAULTS_RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout.splitlines()[-1] and "skipped" not in out.stdout.splitlines()[-1]
