"""A plan against a measured run (gdpo_jax/scale/measure.py, experiments/check_plan.py).

The comparison's arithmetic is checked against hand-worked values on a made-up
plan; the command runs end to end on this CPU (no peak-memory counter here:
the memory columns read n/a, the times and the compiler's figures are real).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest

from gdpo_jax.scale.arch import PlanError
from gdpo_jax.scale.measure import check_matches, compare, format_comparison
from gdpo_jax.scale.plan import config_digest
from gdpo_jax.train import mesh as mesh_lib
from gdpo_jax.train.config import base_config
from tests._quick_compile import quick_compile_flags
from tests._subprocess import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 2**30
H100_PEAK = 989e12  # the 1xh100 target's dense bf16 FLOP/s (targets.CHIPS)


def _tiny(**algo):
    c = base_config()
    c.task.name = "toy_toolcall"
    c.model.tokenizer = "toy_words"
    c.rewards.names = ("toy_format", "toy_correct")
    c.algo.num_prompts, c.algo.group_size = 2, 4
    c.algo.update(algo)
    c.sampling.max_prompt_len, c.sampling.max_new_tokens = 8, 8
    return c


def _plan(cfg, **extra) -> dict:
    """A made-up plan of `cfg` on 1xh100 with round figures (hand-checkable)."""
    plan = dict(
        target="1xh100",
        platform="cuda",
        device="1 x NVIDIA H100",
        num_devices=1,
        mesh={"data": 1, "fsdp": 1, "tensor": 1},
        rows=8,
        config_digest=config_digest(cfg),
        model="tiny",
        programs={
            "step": dict(total_bytes=10 * GIB, temps=2 * GIB),
            "logprob": dict(total_bytes=6 * GIB, temps=1 * GIB, runs_per_step=2),
            "generate": dict(total_bytes=4 * GIB, temps=GIB // 2, rows_per_call=4),
        },
        roofline=dict(train=2.0, logprob=1.0, prefill=0.25, decode=0.75),
        flops=dict(train=9.89e12, logprob=4e12, prefill=1e12, decode=1e12),
    )
    plan.update(extra)
    return plan


def test_compare_against_hand_arithmetic() -> None:
    measured = {
        "step": dict(
            median_s=4.0,
            peak_bytes=11 * GIB,
            setup_peak_bytes=5 * GIB,
            compile_peak_bytes=7 * GIB,
            compiled=dict(temps=3 * GIB),
        ),
        "logprob": dict(median_s=1.0, peak_bytes=None),
        # A peak no higher than the setup's: the program's own is at most that.
        "generate": dict(median_s=1.0, peak_bytes=3 * GIB, setup_peak_bytes=5 * GIB),
    }
    rows = {r["program"]: r for r in compare(_plan(_tiny()), measured)}
    step, lp, gen = rows["step"], rows["logprob"], rows["generate"]
    # step: 11 / 10 GiB; 4 s against the roofline's 2 s; 9.89e12 FLOPs in 4 s of 989e12/s.
    assert step["memory_ratio"] == pytest.approx(1.1)
    assert step["time_ratio"] == pytest.approx(2.0)
    assert step["mfu"] == pytest.approx(0.0025)
    assert step["device_temps"] == 3 * GIB and step["compile_peak_bytes"] == 7 * GIB
    assert not step["peak_is_setup"]
    # logprob: the roofline counts 2 passes per step: 0.5 s and 2e12 FLOPs per pass.
    assert lp["roofline_s"] == pytest.approx(0.5) and lp["memory_ratio"] is None
    assert lp["mfu"] == pytest.approx(2e12 / H100_PEAK)
    # generate: 8 rows in calls of 4 = 2 calls; (0.25 + 0.75) / 2 s and 1e12 FLOPs per call.
    assert gen["roofline_s"] == pytest.approx(0.5) and gen["time_ratio"] == pytest.approx(2.0)
    assert gen["mfu"] == pytest.approx(1e12 / H100_PEAK)
    assert gen["peak_is_setup"]
    # A step that runs one of the roofline's two log-prob passes itself (the
    # reference's), the log-prob program the other: 2 s + 1 s / 2 and 9.89e12 + 4e12 / 2
    # FLOPs for the step; 0.5 s and 2e12 FLOPs for the program's one pass.
    fused = _plan(_tiny(), step_shape=dict(logprob_passes=2))
    fused["programs"]["step"]["logprob_passes"] = 1
    fused["programs"]["logprob"]["runs_per_step"] = 1
    got = {r["program"]: r for r in compare(fused, measured)}
    assert got["step"]["roofline_s"] == pytest.approx(2.5)
    assert got["step"]["mfu"] == pytest.approx(11.89e12 / (4.0 * H100_PEAK))
    assert got["logprob"]["roofline_s"] == pytest.approx(0.5)
    assert got["logprob"]["mfu"] == pytest.approx(2e12 / H100_PEAK)
    table = format_comparison(list(rows.values()))
    assert "| step | 10.00 | 11.00 | 1.10 | 7.00 | 2.00 / 3.00 |" in table
    assert "| logprob | 6.00 | n/a | n/a | n/a | 1.00 / n/a |" in table
    assert "| generate | 4.00 | <= 3.00 |" in table


def test_check_matches_refuses_another_platform_mesh_or_config() -> None:
    cfg = _tiny()
    mesh = mesh_lib.make_mesh((1, -1, 1), axis_types="auto", devices=jax.devices()[:1])
    plan = _plan(cfg)
    with pytest.raises(PlanError, match="--any_platform"):
        check_matches(plan, cfg, mesh)  # a cuda plan, a cpu machine
    check_matches(plan, cfg, mesh, any_platform=True)
    with pytest.raises(PlanError, match="2 devices"):
        check_matches(_plan(cfg, num_devices=2), cfg, mesh, any_platform=True)
    # A field no program depends on (the run's directory) leaves the digest alone...
    moved = _tiny()
    moved.workdir = "/elsewhere"
    check_matches(plan, moved, mesh, any_platform=True)
    # ... one a program depends on does not.
    with pytest.raises(PlanError, match="config_digest"):
        check_matches(plan, _tiny(beta=0.04), mesh, any_platform=True)
    old = {k: v for k, v in plan.items() if k != "config_digest"}  # an older planner's plan
    with pytest.raises(PlanError, match="plan again"):
        check_matches(old, cfg, mesh, any_platform=True)


def _run(*args: str) -> subprocess.CompletedProcess:
    env = child_env()
    # One CPU device, as the made-up plan's 1xh100; the suite's quick compile.
    env["XLA_FLAGS"] = quick_compile_flags()
    cmd = [sys.executable, "-m", "experiments.check_plan", "--config=configs/tiny_cpu.py", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_cli_measures_each_program_in_fresh_processes(tmp_path) -> None:
    from configs.tiny_cpu import get_config

    cfg = get_config()
    cfg.algo.beta = 0.04  # a reference: the plan has a log-prob pass
    # Small and quick: 2 prompts, one update, a one-layer model (the six processes
    # each build it, and two of them compile the step: a deeper model only compiles
    # longer). The same overrides on the command line give the plan's digest.
    tiny = dict(num_layers=1, hidden_size=64, intermediate_size=128, head_dim=16)
    cfg.algo.num_prompts, cfg.algo.num_minibatches = 2, 1
    cfg.model.tiny.update(tiny)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(_plan(cfg)))
    small = (
        "--config.algo.num_prompts=2",
        "--config.algo.num_minibatches=1",
        *(f"--config.model.tiny.{k}={v}" for k, v in tiny.items()),
    )
    beta = "--config.algo.beta=0.04"
    # A cuda plan on this CPU: refused in one line before anything is compiled.
    refused = _run(*small, beta, f"--plan={plan_path}", "--steps=1")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("error: the plan is for 1xh100")
    # Another config than the plan's: refused too.
    other = _run(*small, f"--plan={plan_path}", "--any_platform", "--steps=1")
    assert other.returncode == 2 and "config_digest" in other.stderr
    out = tmp_path / "check.json"
    done = _run(*small, beta, f"--plan={plan_path}", "--any_platform", "--steps=2", f"--json={out}")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["command"].startswith("python -m experiments.check_plan ")
    assert f"--plan={plan_path}" in result["command"] and beta in result["command"]
    assert [r["program"] for r in result["rows"]] == ["step", "logprob", "generate"]
    for name, m in result["measured"].items():
        assert len(m["times_s"]) == 2 and all(t > 0 for t in m["times_s"]), name
        assert m["peak_bytes"] is None  # XLA:CPU keeps no counter
        assert m["compiled"]["temps"] > 0 and m["compile_s"] > 0, name  # the compile phase's
        assert (tmp_path / f"check.{name}.compile.log").exists()
        assert (tmp_path / f"check.{name}.run.log").exists()
    assert m["rows_per_call"] == 16  # generate: 2 prompts x G 8 in one call
    assert "| step | " in done.stdout and "n/a" in done.stdout


def test_parent_keeps_off_the_gpus_memory_and_children_get_the_users_setting(monkeypatch):
    """On a GPU, the checking process's JAX client would take 75 % of the memory the
    measuring processes need: main turns the preallocation off for itself only."""
    from experiments import check_plan

    key = "XLA_PYTHON_CLIENT_PREALLOCATE"
    monkeypatch.setenv(key, "false")  # as main sets it in the parent
    monkeypatch.setattr(check_plan, "_USER_PREALLOCATE", None)
    env = check_plan._child_env("/tmp/x")
    assert key not in env and env["JAX_COMPILATION_CACHE_DIR"] == "/tmp/x/cache"
    monkeypatch.setattr(check_plan, "_USER_PREALLOCATE", "true")
    assert check_plan._child_env("/tmp/x")[key] == "true"
    src = open(check_plan.__file__).read()  # set before validate_config starts the backend
    assert src.index('os.environ[_PREALLOCATE] = "false"') < src.index("validated_copy(flags")


def test_a_field_added_at_its_old_behaviour_keeps_the_committed_plans_digest() -> None:
    """algo.nan_rewards="omit" compiles what configs without the field did: the digest
    leaves it out, so the committed plans hold; "zero" is another program."""
    cfg = _tiny()
    with_field = config_digest(cfg)
    with cfg.algo.unlocked():
        del cfg.algo["nan_rewards"]
    assert config_digest(cfg) == with_field
    cfg = _tiny(nan_rewards="zero")
    assert config_digest(cfg) != with_field
