"""The CLI as a user runs it: SIGKILL in the middle of a run, rerun, it resumes and finishes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

from tests._subprocess import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cmd(workdir: str, num_steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "experiments.train",
        "--config=configs/tiny_cpu.py:runlocal",
        "--config.algo.estimator=grpo",
        f"--config.workdir={workdir}",
        f"--config.train.num_steps={num_steps}",
        "--config.checkpoint.every=1",
        "--config.train.eval_every=0",
        "--config.train.progress_bar=False",
        "--config.model.tiny.num_layers=1",
        "--config.model.tiny.hidden_size=64",
        "--config.model.tiny.intermediate_size=128",
        "--config.model.tiny.head_dim=16",
        "--config.mesh.num_devices=2",
    ]


def _complete_steps(ckpt_dir: str) -> list[int]:
    return (
        sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())
        if os.path.isdir(ckpt_dir)
        else []
    )


@pytest.mark.slow
def test_sigkill_then_resume(tmp_path):
    wd = str(tmp_path / "run")
    ckpt = os.path.join(wd, "checkpoints")
    env = child_env()
    proc = subprocess.Popen(
        _cmd(wd, 10_000),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while len(_complete_steps(ckpt)) < 1 or max(_complete_steps(ckpt)) < 3:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.time() < deadline, "no checkpoint within the time limit"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)  # no clean-up, possibly mid-save
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed_at = max(_complete_steps(ckpt))
    target = killed_at + 2
    out = subprocess.run(
        _cmd(wd, target), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed from step {killed_at}" in out.stderr
    # Two CPU devices under the ordered scheduler (the suite's XLA_FLAGS, from `import
    # gdpo_jax`): safe to load from the suite's shared cache, so it stays on.
    assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in env["XLA_FLAGS"]
    assert "persistent compilation cache off for this run" not in out.stderr
    lines = [json.loads(line)["step"] for line in open(os.path.join(wd, "metrics.jsonl"))]
    assert set(range(1, target + 1)) <= set(lines)
    assert lines[-2:] == [target - 1, target]  # the resumed run logged the last steps
    assert max(_complete_steps(ckpt)) == target
    assert not [d for d in os.listdir(ckpt) if "tmp" in d]  # leftovers cleaned up


def _cmd_async8(workdir: str, num_steps: int) -> list[str]:
    """The 8-device fake mesh (conftest's XLA_FLAGS reach the child), async saves, every step.
    No TensorBoard: importing its writer costs each of the three processes seconds, and
    resuming with it on is test_sigkill_then_resume's."""
    cmd = _cmd(workdir, num_steps)
    cmd[cmd.index("--config.mesh.num_devices=2")] = "--config.mesh.num_devices=8"
    return cmd + [
        "--config.checkpoint.async_save=True",
        "--config.checkpoint.keep=2",
        "--config.train.tensorboard=False",
    ]


def _final_state(ckpt_dir: str, step: int) -> dict:
    import numpy as np
    import orbax.checkpoint as ocp

    # Values only, onto this process's default placement: no target shardings, which
    # orbax warns about (the checkpoints hold the run's own sharding file).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sharding info not provided when restoring")
        tree = ocp.PyTreeCheckpointer().restore(os.path.join(ckpt_dir, str(step), "state"))
    return {jax_path: np.asarray(v) for jax_path, v in _flatten(tree["train_state"]).items()}


def _flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}/{k}"))
        return out
    if isinstance(tree, (list, tuple)):
        out = {}
        for i, v in enumerate(tree):
            out.update(_flatten(v, f"{prefix}/{i}"))
        return out
    return {prefix: tree}


def _metrics(workdir: str) -> dict[int, dict]:
    out = {}
    for line in open(os.path.join(workdir, "metrics.jsonl")):
        rec = json.loads(line)
        out[rec["step"]] = {
            k: v for k, v in rec.items() if not k.startswith(("time/", "perf/", "reward_time/"))
        }
    return out


@pytest.mark.slow
def test_sigkill_during_async_save_on_8_devices_resumes_exactly(tmp_path):
    """kill -9 while an async save is being written; the rerun equals an uninterrupted run.
    Steps up to the kill are logged by the killed process, the rest by the rerun: every
    non-timing metric equal to the full run's is also three fresh processes agreeing (no
    dependence on thread scheduling, dict order or process-level state)."""
    n = 6
    env = child_env()
    full = str(tmp_path / "full")
    out = subprocess.run(
        _cmd_async8(full, n), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]

    wd = str(tmp_path / "killed")
    ckpt = os.path.join(wd, "checkpoints")
    proc = subprocess.Popen(
        _cmd_async8(wd, n),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    in_flight: list[str] = []
    try:
        deadline = time.time() + 240
        while not in_flight:
            # Orbax writes a step into "<step>.orbax-checkpoint-tmp-*" and renames it when
            # complete: kill as soon as the step-2-or-later one appears.
            names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
            in_flight = [d for d in names if "tmp" in d and int(d.split(".")[0]) >= 2]
            assert proc.poll() is None, "run finished before a save was caught in flight"
            assert time.time() < deadline, "no checkpoint within the time limit"
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    left = [d for d in os.listdir(ckpt) if "tmp" in d]
    # The kill landed before orbax finished and renamed that step's directory.
    assert left, f"save of {in_flight} completed before the kill; not a mid-save kill"
    complete = _complete_steps(ckpt)
    resume_from = max(complete) if complete else 0
    assert resume_from < n

    out = subprocess.run(
        _cmd_async8(wd, n), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    if resume_from:
        assert f"resumed from step {resume_from}" in out.stderr
    assert not [d for d in os.listdir(ckpt) if "tmp" in d]  # the killed save's dir is gone
    full_m, resumed_m = _metrics(full), _metrics(wd)
    assert sorted(resumed_m) == list(range(1, n + 1))
    for step in range(1, n + 1):
        assert resumed_m[step] == full_m[step], step
    a = _final_state(os.path.join(full, "checkpoints"), n)
    b = _final_state(ckpt, n)
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), k


@pytest.mark.slow
def test_a_sigterm_stops_the_cli_with_the_step_saved_one_line_and_status_143(tmp_path):
    # A scheduler's preemption notice: the step in flight is saved and the CLI exits 143
    # (what SIGTERM's own ending reports) with one line, not a traceback or status 0.
    wd = str(tmp_path / "run")
    cmd = _cmd(wd, 10_000)
    cmd[cmd.index("--config.checkpoint.every=1")] = "--config.checkpoint.every=1000"
    cmd[cmd.index("--config.mesh.num_devices=2")] = "--config.mesh.num_devices=1"
    env = child_env()
    proc = subprocess.Popen(
        cmd + ["--config.train.tensorboard=False", "--config.train.log_every=1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 240
        metrics = os.path.join(wd, "metrics.jsonl")
        # Whole lines only: a line read while it is written is not JSON yet.
        while not os.path.exists(metrics) or open(metrics).read().count("\n") < 2:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.time() < deadline, "no step within the time limit"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    stopped = [line for line in err.splitlines() if line.startswith("stopped: ")]
    last = max(_metrics(wd))
    assert stopped == [
        f"stopped: preemption notice (SIGTERM): stopped after step {last} and saved it in "
        f"{os.path.join(wd, 'checkpoints')}; run the same command to resume from step {last}."
    ], err[-3000:]
    assert "Traceback" not in err
    assert _complete_steps(os.path.join(wd, "checkpoints")) == [last]
