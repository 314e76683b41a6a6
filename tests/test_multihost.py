"""Two processes on one CPU machine (gloo collectives, loopback coordinator):
the 2-process step (each host feeding only its own rows), sampler (each host
passing its own prompts, getting its own rows) and RL loop equal 1 process's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nproc: int, tmp_path) -> list[dict]:
    wd = str(tmp_path / "workdir")
    port = _free_port()
    # No persistent compilation cache: each worker runs XLA:CPU programs over 2 local
    # devices, which can deadlock when loaded from it (gdpo_jax/compile_cache.py). Across
    # processes nothing aborts: both workers waited in their collectives until the timeout.
    drop = ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR", "JAX_COMPILATION_CACHE_MAX_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = ROOT
    outs = [str(tmp_path / f"p{nproc}_{i}.json") for i in range(nproc)]
    # Each worker logs to its own file, not a pipe: a pipe read only after the other
    # worker ends could fill up and block its writer inside a collective.
    log_paths = [tmp_path / f"p{nproc}_{i}.log" for i in range(nproc)]
    log_files = [open(path, "w") for path in log_paths]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests._multihost_worker",
                str(i),
                str(nproc),
                str(port),
                outs[i],
                wd,
            ],
            cwd=ROOT,
            env=env,
            stdout=log_files[i],
            stderr=subprocess.STDOUT,
        )
        for i in range(nproc)
    ]
    try:
        for p in procs:
            # Generous: a loaded CI machine runs the two processes several times slower.
            p.wait(timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in log_files:
            f.close()
    for p, path in zip(procs, log_paths):
        assert p.returncode == 0, path.read_text()[-3000:]
    return [json.load(open(o)) for o in outs]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _launch(2, tmp_path_factory.mktemp("two"))


@pytest.mark.slow
def test_two_processes_match_one(two):
    import jax

    from tests._multihost_worker import run_step

    one = run_step(jax.devices()[:4])  # this process, 4 of its 8 fake devices
    assert one["rows"] == [0, 16]
    assert [r["rows"] for r in two] == [[0, 8], [8, 16]]
    for r in two:
        for k, v in one["metrics"].items():
            np.testing.assert_allclose(r["metrics"][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
        np.testing.assert_allclose(r["param_sums"], one["param_sums"], rtol=1e-5)
        for k, v in one["fused_metrics"].items():  # the reference forward in the step
            np.testing.assert_allclose(r["fused_metrics"][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
        np.testing.assert_allclose(r["fused_param_sums"], one["fused_param_sums"], rtol=1e-5)
    assert one["metrics"]["loss"] != 0.0 and one["metrics"]["kl"] > 0
    assert one["fused_metrics"]["kl"] > 1e-3  # the reference is another model


@pytest.mark.slow
def test_sampler_process_local_rows_match_one_process(two):
    import jax

    from tests._multihost_worker import SAMPLER_PROMPTS, run_sampler

    one = run_sampler(jax.devices()[:4], sum(SAMPLER_PROMPTS, []))  # 5 prompts x G=2
    p0, p1 = two[0]["sampler"], two[1]["sampler"]
    # Each process got back only its own rows (3 and 2 prompts x 2), local group ids.
    assert len(p0["tokens"]) == 6 and len(p1["tokens"]) == 4
    assert p0["group_ids"] == [0, 0, 1, 1, 2, 2] and p1["group_ids"] == [0, 0, 1, 1]
    assert p0["row_offset"] == 0 and p1["row_offset"] == 6
    np.testing.assert_array_equal(
        np.asarray(p1["prompt_ids"])[::2, -4:], [[13, 14, 15, 16], [0, 0, 17, 18]]
    )
    # Sampled (temperature 1) rows equal the one-process run's rows at the same
    # global index: randomness follows the global row, not the process.
    np.testing.assert_array_equal(p0["tokens"] + p1["tokens"], one["tokens"])
    np.testing.assert_allclose(
        p0["logprobs"] + p1["logprobs"], one["logprobs"], rtol=1e-5, atol=1e-6
    )
    assert len({tuple(t) for t in one["tokens"]}) > 5  # really sampled, not constant


@pytest.mark.slow
def test_chunked_sampler_calls_over_two_processes_match_one_call(two):
    """The trainer's chunked calls (4 prompts per process, 2 per call) sample what
    one process's single call over all 8 prompts does: each process numbers its
    rows from its place in the whole batch. Numbering them from each call's
    global start gave process 0's second chunk the ids process 1's first holds."""
    import jax

    from tests._multihost_worker import CHUNKED_PROMPTS, run_sampler

    one = run_sampler(jax.devices()[:4], CHUNKED_PROMPTS)
    p0, p1 = two[0]["sampler_chunked"], two[1]["sampler_chunked"]
    assert p0["calls"] == p1["calls"] == 2
    np.testing.assert_array_equal(p0["tokens"] + p1["tokens"], one["tokens"])
    np.testing.assert_allclose(
        np.asarray(p0["logprobs"] + p1["logprobs"]),
        np.asarray(one["logprobs"]),
        rtol=1e-5,
        atol=1e-6,
    )
    assert len({tuple(t) for t in one["tokens"]}) > 8  # really sampled, not constant


@pytest.mark.slow
def test_rl_loop_two_processes_match_one(two, tmp_path):
    from tests._multihost_worker import run_loop

    one = run_loop(str(tmp_path / "one"), num_devices=4)
    assert "eval/test_short" in one[1] and "reward/test_has_w10/mean" in one[0]
    for r in two:
        for step in range(2):
            assert set(r["loop"][step]) == set(one[step])
            for k, v in one[step].items():
                np.testing.assert_allclose(
                    r["loop"][step][k], v, rtol=2e-5, atol=1e-6, err_msg=f"step {step}: {k}"
                )
    assert one[1]["loss"] != one[0]["loss"]
    assert 0 < one[1]["reward/test_short/mean"] < 1 or 0 < one[0]["reward/test_short/mean"] < 1


def test_chunked_generation_two_processes(two):
    # sampling.rows_per_call with 2 processes: every process makes the same
    # number of collective sampler calls (no hang) and sees the same global metrics.
    a, b = (r["loop_chunked"] for r in two)
    assert [m["data/sample_calls"] for m in a] == [2, 2] == [m["data/sample_calls"] for m in b]
    for step in range(2):
        assert set(a[step]) == set(b[step])
        for k, v in a[step].items():
            np.testing.assert_allclose(b[step][k], v, rtol=1e-6, err_msg=f"step {step}: {k}")
        assert np.isfinite(a[step]["loss"])
    assert "eval/test_short" in a[1]
    # The reward fails on process 1's 8 rows per step (4 per call): process 0
    # reports them too, and the eval's failures are not mixed in.
    for m in (a[0], b[0]):
        assert m["reward_failures/test_fails_on_p1"] == 8
        assert m["reward_failures/test_has_w10"] == 0


def test_combine_rows_by_hand():
    from gdpo_jax.train.distributed import combine_rows

    table = np.array([[1.0, 0.5, 2.0], [3.0, 0.25, 0.0]])  # 2 processes x 3 keys
    out = combine_rows(
        table,
        ["reward_failures/a", "time/step_s", "reward_time/a"],
        max_prefixes=("time/", "reward_time/"),
    )
    assert out == {"reward_failures/a": 4.0, "time/step_s": 0.5, "reward_time/a": 2.0}
