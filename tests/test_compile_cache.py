"""Programs over several CPU devices never go through the persistent compilation
cache (gdpo_jax/compile_cache.py): in a run (`cpu_collectives_compiled_fresh`)
and in this suite's processes (tests/conftest.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

from gdpo_jax import compile_cache
from gdpo_jax.sharding import batch_sharding, make_mesh

ORDERED = compile_cache.ORDERED_SCHEDULER
DEFAULT = f"--{compile_cache.SCHEDULER_FLAG}=true"  # XLA's default scheduler, named
COUNT_8 = "--xla_force_host_platform_device_count=8"


@pytest.fixture
def fresh_cache_dir(tmp_path):
    """The persistent cache in an empty directory, every program stored (no minimum
    compile time); the session's settings come back afterwards."""
    saved = {
        k: getattr(jax.config, k)
        for k in (
            "jax_compilation_cache_dir",
            "jax_enable_compilation_cache",
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes",
        )
    }
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()
    yield tmp_path
    for k, v in saved.items():
        jax.config.update(k, v)
    compilation_cache.reset_cache()


def _lambdas(path) -> set[str]:
    """The cache entries of jitted lambdas (not of the inputs' own small programs)."""
    return {f for f in os.listdir(path) if f.startswith("jit__lambda") and f.endswith("-cache")}


def test_only_single_device_cpu_programs_are_safe_to_cache(monkeypatch):
    monkeypatch.setattr(compile_cache, "_flags_at_start", COUNT_8)
    assert compile_cache.cache_is_safe("cpu", 1)
    assert not compile_cache.cache_is_safe("cpu", 2)
    assert compile_cache.cache_is_safe("gpu", 8) and compile_cache.cache_is_safe("tpu", 8)


@pytest.mark.parametrize(
    "flags, ordered",
    [
        ("", False),
        ("--xla_force_host_platform_device_count=8", False),
        ("--xla_cpu_enable_concurrency_optimized_scheduler=false", True),
        (
            "--xla_force_host_platform_device_count=8 "
            "--xla_cpu_enable_concurrency_optimized_scheduler=0",
            True,
        ),
        ("--xla_cpu_enable_concurrency_optimized_scheduler=true", False),
        # XLA parses left to right: the last setting wins.
        (
            "--xla_cpu_enable_concurrency_optimized_scheduler=false "
            "--xla_cpu_enable_concurrency_optimized_scheduler=true",
            False,
        ),
        ("--xla_cpu_enable_concurrency_optimized_scheduler_extra=false", False),
    ],
)
def test_several_cpu_devices_are_safe_with_the_ordered_scheduler(monkeypatch, flags, ordered):
    assert compile_cache.ordered_cpu_scheduler(flags) is ordered
    assert compile_cache.cache_is_safe("cpu", 8, flags) is ordered
    monkeypatch.setattr(compile_cache, "_flags_at_start", flags)  # what the backend started with
    assert compile_cache.cache_is_safe("cpu", 8) is ordered


def test_the_suite_stores_single_device_programs_but_not_sharded_ones(fresh_cache_dir):
    # The suite runs under the ordered scheduler (`import gdpo_jax` in conftest), and
    # still keeps its sharded CPU programs out of the shared cache (tests/conftest.py).
    assert compile_cache.ordered_cpu_scheduler()
    salt = float(np.random.default_rng().integers(1 << 20))  # a program no one compiled yet

    jax.jit(lambda x: jnp.sin(x) * salt)(jnp.ones(8)).block_until_ready()
    stored = _lambdas(fresh_cache_dir)
    assert len(stored) == 1  # the one-device program

    x = jax.device_put(jnp.ones(8), batch_sharding(make_mesh((8, 1, 1)), 1))
    jax.jit(lambda x: jnp.sum(jnp.cos(x) * salt))(x).block_until_ready()  # an all-reduce
    assert _lambdas(fresh_cache_dir) == stored


def test_a_run_on_several_cpu_devices_turns_the_cache_off_and_back_on(fresh_cache_dir, monkeypatch):
    assert jax.device_count() == 8
    # The flags the backend started with (`compile_cache.started_xla_flags`).
    monkeypatch.setattr(compile_cache, "_flags_at_start", COUNT_8)
    with compile_cache.cpu_collectives_compiled_fresh(compile_cache.run_devices(0)) as off:
        assert off and not jax.config.jax_enable_compilation_cache
    assert jax.config.jax_enable_compilation_cache
    with compile_cache.cpu_collectives_compiled_fresh(compile_cache.run_devices(1)) as off:
        assert not off and jax.config.jax_enable_compilation_cache
    assert compile_cache.run_devices(2) == 2
    # With the ordered scheduler in XLA_FLAGS the run keeps the cache.
    monkeypatch.setattr(compile_cache, "_flags_at_start", f"{COUNT_8} {ORDERED}")
    with compile_cache.cpu_collectives_compiled_fresh(compile_cache.run_devices(0)) as off:
        assert not off and jax.config.jax_enable_compilation_cache


def test_several_cpu_devices_under_the_default_scheduler_warn_once_naming_the_flag(
    monkeypatch, caplog
):
    """XLA started without the ordered scheduler (JAX before gdpo_jax, or XLA_FLAGS'
    choice): a run over several CPU devices says once that its collectives can
    deadlock and names the flag; the ordered scheduler or one device says nothing."""

    def warnings_of(num_devices: int, flags: str, times: int = 1) -> list[str]:
        monkeypatch.setattr(compile_cache, "_flags_at_start", flags)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="gdpo_jax.compile_cache"):
            for _ in range(times):
                with compile_cache.cpu_collectives_compiled_fresh(num_devices):
                    pass
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    monkeypatch.setattr(compile_cache, "_warned", False)
    (line,) = warnings_of(8, f"{COUNT_8} {DEFAULT}", times=3)
    assert "over 8 devices under its concurrency-optimized scheduler" in line
    assert f"start the process with {ORDERED} in XLA_FLAGS" in line
    for num_devices, flags in ((8, f"{COUNT_8} {ORDERED}"), (1, COUNT_8)):
        monkeypatch.setattr(compile_cache, "_warned", False)
        assert warnings_of(num_devices, flags) == []
    monkeypatch.setattr(compile_cache, "_warned", False)
    assert len(warnings_of(2, COUNT_8)) == 1  # no scheduler flag at all: XLA's default


def test_the_sft_cli_builds_and_runs_with_the_cache_off_on_several_cpu_devices(
    fresh_cache_dir, monkeypatch, tmp_path
):
    # `gdpo-sft` built and ran its SFT directly, outside `run_sft`'s guard: on several
    # CPU devices its programs were loaded from the persistent cache.
    from experiments import sft as sft_cli
    from gdpo_jax.train import sft as sft_lib
    from gdpo_jax.train import sft_checks
    from gdpo_jax.train.schema import base_config

    monkeypatch.setattr(compile_cache, "_flags_at_start", COUNT_8)
    seen = []

    class FakeSFT:
        def __init__(self, cfg):
            seen.append(("build", jax.config.jax_enable_compilation_cache))

        def run(self):
            seen.append(("run", jax.config.jax_enable_compilation_cache))
            return {"steps": 0}

    monkeypatch.setattr(sft_lib, "SFT", FakeSFT)
    # The CLI's early config check (SFT's own, which FakeSFT stands in for) passes.
    monkeypatch.setattr(sft_checks, "validate_sft_config", lambda cfg: None)
    cfg = base_config()
    cfg.workdir = str(tmp_path)
    assert sft_cli._build_and_run(cfg) == {"steps": 0}
    assert seen == [("build", False), ("run", False)]
    assert jax.config.jax_enable_compilation_cache  # restored
    cfg.mesh.num_devices = 1  # one device: the cache stays on
    seen.clear()
    sft_cli._build_and_run(cfg)
    assert seen == [("build", True), ("run", True)]


# Run in a fresh interpreter: XLA_FLAGS as the backend starts, then changed.
_STARTED_FLAGS = """
import hashlib, os, sys
import jax
from jax._src.lib import _jax
from gdpo_jax import compile_cache
if sys.argv[1] == "start":
    jax.devices()
os.environ["XLA_FLAGS"] = sys.argv[2]  # after the start: XLA does not see it
print(compile_cache.started_xla_flags(), compile_cache.ordered_cpu_scheduler(),
      compile_cache.cache_is_safe("cpu", 8),
      hashlib.sha256(_jax.CompileOptions().SerializeAsString()).hexdigest(), sep="|")
"""


def _started(tmp_path, start_flags: str, order: str, later_flags: str) -> list[str]:
    script = tmp_path / "started_flags.py"
    script.write_text(_STARTED_FLAGS)
    env = {**os.environ, "XLA_FLAGS": start_flags, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, str(script), order, later_flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1].split("|")


def test_the_scheduler_check_reads_the_flags_xla_started_with(tmp_path):
    """XLA parses XLA_FLAGS when the first backend starts: flags set afterwards
    change neither XLA's compile options nor `cache_is_safe`'s answer."""
    count = "--xla_force_host_platform_device_count=2"
    # Ordered at the start, then dropped: XLA still runs the ordered scheduler.
    kept = _started(tmp_path, f"{count} {ORDERED}", "start", count)
    assert kept[:3] == [f"{count} {ORDERED}", "True", "True"]
    # XLA's default scheduler at the start (named: `import gdpo_jax` adds the ordered
    # one to flags naming neither), then the ordered one: the cache stays off.
    default = f"{count} {DEFAULT}"
    added = _started(tmp_path, default, "start", f"{count} {ORDERED}")
    assert added[:3] == [default, "False", "False"]
    # Set before the backend starts: XLA and the check both see the new flags.
    before = _started(tmp_path, default, "later", f"{count} {ORDERED}")
    assert before[:3] == [f"{count} {ORDERED}", "True", "True"]
    # XLA's own compile options agree: each run's match those of the flags recorded.
    assert kept[3] == before[3] != added[3]


def test_the_microbatch_tuner_times_with_the_cache_off_on_several_cpu_devices(
    fresh_cache_dir, monkeypatch
):
    # tune_microbatches built and timed the step outside the run's guard: on several CPU
    # devices it wrote the step to the cache and loaded it the next time ("compile s" 3.0
    # against 11.6 fresh).
    from gdpo_jax.train import tune
    from gdpo_jax.train.schema import base_config

    monkeypatch.setattr(compile_cache, "_flags_at_start", COUNT_8)
    seen = []
    monkeypatch.setattr(
        tune, "_time_microbatches", lambda *a: seen.append(jax.config.jax_enable_compilation_cache)
    )
    cfg = base_config()
    tune.time_microbatches(cfg, (1,), steps=1)
    assert seen == [False] and jax.config.jax_enable_compilation_cache


def test_a_comparison_whose_cache_dir_cannot_be_made_runs_without_it(tmp_path, monkeypatch, caplog):
    # An unwritable parent of --out_dir ended gdpo-compare with a PermissionError traceback.
    import logging

    from experiments import compare_runs

    before = jax.config.jax_compilation_cache_dir

    def denied(path, exist_ok=False):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(compare_runs.os, "makedirs", denied)
    with caplog.at_level(logging.WARNING, logger="gdpo_jax.compare"):
        compare_runs.enable_compilation_cache(str(tmp_path / "ro" / ".jax_cache"))
    assert "no compilation cache" in caplog.text
    assert jax.config.jax_compilation_cache_dir == before


def test_the_smollm2_demo_trains_with_the_cache_off_on_several_cpu_devices(
    fresh_cache_dir, monkeypatch, tmp_path
):
    from experiments import smollm2_demo
    from gdpo_jax.train.schema import base_config

    monkeypatch.setattr(compile_cache, "_flags_at_start", COUNT_8)
    seen = []

    class FakeTrainer:
        def __init__(self, cfg):
            seen.append(("build", jax.config.jax_enable_compilation_cache))

        def evaluate(self):
            return {"eval/x": 1.0}

        def run(self):
            seen.append(("run", jax.config.jax_enable_compilation_cache))

    smollm2_demo._train(base_config(), str(tmp_path / "eval0.json"), FakeTrainer)
    assert seen == [("build", False), ("run", False)]
    assert (tmp_path / "eval0.json").exists()


def _spy_on_the_cache(monkeypatch, seen: list, targets) -> None:
    """Each (owner, name, tag) of `targets` appends (tag, whether the cache is on) to
    `seen` when called. Spies go on what the guarded methods call: a spy on a guarded
    method itself would run outside its guard."""
    for owner, name, tag in targets:
        real = getattr(owner, name)

        def spy(*a, _real=real, _tag=tag, **kw):
            seen.append((_tag, jax.config.jax_enable_compilation_cache))
            return _real(*a, **kw)

        monkeypatch.setattr(owner, name, spy)


def test_a_trainer_used_directly_builds_steps_and_evaluates_with_the_cache_off(
    fresh_cache_dir, monkeypatch, tmp_path
):
    # `Trainer(cfg).run()` (notebook 03's pattern) and a notebook's own train_step /
    # evaluate calls went round `train()`'s guard: on several CPU devices they could
    # load their programs from the persistent cache.
    from gdpo_jax.train import build, loop, rollout
    from tests._train_fixtures import tiny_config

    monkeypatch.setattr(compile_cache, "_flags_at_start", COUNT_8)
    seen = []
    real_build = build.build_model

    def build_model(*a, **kw):
        seen.append(("build", jax.config.jax_enable_compilation_cache))
        return real_build(*a, **kw)

    monkeypatch.setattr(build, "build_model", build_model)
    _spy_on_the_cache(
        monkeypatch, seen, ((loop.Trainer, "_collect", "step"), (rollout, "score_shared", "eval"))
    )
    cfg = tiny_config(str(tmp_path / "run"))
    cfg.mesh.num_devices = 2
    cfg.train.num_steps = 1
    cfg.train.eval_every = 1
    trainer = loop.Trainer(cfg)
    assert jax.config.jax_enable_compilation_cache  # back on between calls
    trainer.train_step(0)
    trainer.evaluate()
    assert seen[:2] == [("build", False), ("step", False)] and set(seen[2:]) == {("eval", False)}
    assert jax.config.jax_enable_compilation_cache
    seen.clear()
    trainer.run()
    assert set(seen) == {("step", False), ("eval", False)}


def test_an_sft_used_directly_builds_steps_and_evaluates_with_the_cache_off(
    fresh_cache_dir, monkeypatch, tmp_path
):
    from gdpo_jax.train import rollout
    from gdpo_jax.train import sft as sft_lib
    from tests.test_sft import _config

    monkeypatch.setattr(compile_cache, "_flags_at_start", COUNT_8)
    seen = []
    _spy_on_the_cache(
        monkeypatch,
        seen,
        (
            (sft_lib, "load_task", "build"),
            (sft_lib.SFT, "local_batch", "step"),
            (rollout, "score_shared", "eval"),
        ),
    )
    cfg = _config(tmp_path / "sft")
    cfg.sft.num_steps = 1
    cfg.mesh.num_devices = 2
    sft = sft_lib.SFT(cfg)
    assert jax.config.jax_enable_compilation_cache  # back on between calls
    sft.step(0)
    sft.evaluate()
    assert seen[:2] == [("build", False), ("step", False)] and set(seen[2:]) == {("eval", False)}
    assert jax.config.jax_enable_compilation_cache
