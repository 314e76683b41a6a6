"""Two processes on one CPU machine (gloo collectives, loopback coordinator):
the 2-process host collectives, step (each host feeding only its own rows), sampler
(each host passing its own prompts, getting its own rows) and RL loop equal 1 process's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests._once import once_per_session

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nproc: int, tmp_path) -> list[dict]:
    wd = str(tmp_path / "workdir")
    port = _free_port()
    # No persistent compilation cache, and each worker's own XLA_FLAGS: `import gdpo_jax`
    # and `distributed.initialize` give them XLA:CPU's ordered scheduler. With the default
    # one the workers' collectives deadlocked now and then (both waited until the timeout,
    # or gloo aborted on a "collective mismatch"; gdpo_jax/xla_cpu.py).
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
    # Launched once a session: both xdist workers ran it side by side before (tests/_once.py).
    return once_per_session(tmp_path_factory, "multihost_two", lambda d: _launch(2, d))


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
    # Each process saved the checkpoint and resumed from it: the step, the key and the
    # parameters it had (a multi-process save used to raise at the first checkpoint).
    for r in two:
        assert r["resume"]["start_step"] == 2
        assert r["resume"]["key_equal"] and r["resume"]["params_equal"]
    assert two[0]["resume"]["key_data"] == two[1]["resume"]["key_data"]


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


def test_host_collectives_two_processes_match_one(two, tmp_path):
    """Host collectives over 2 processes give what 1 process does, exact and in the same
    dtype. They used to go through device_put (int64 / float64 -> int32 / float32 without
    x64: 2**31 + 5 wrapped, 16777217 + 16777217 summed to 33554432), a lone surrogate
    raised in allgather_strings, and save_pretrained returned on process 1 before
    process 0 had written the export."""
    from tests._multihost_worker import ALLGATHER_CASES, STRINGS, run_collectives

    one = run_collectives(str(tmp_path / "export"))
    for r in (x["collectives"] for x in two):
        for name in ALLGATHER_CASES:
            dtype, shape, values = one[f"allgather/{name}"]
            assert r[f"allgather/{name}"] == [dtype, [2] + shape[1:], values * 2], name
        assert one["sum_processes"] == [16777217.0, 0.1]
        assert r["sum_processes"] == [33554434.0, 0.2]
        assert r["reduce_processes"] == {"reward_failures/x": 33554434.0, "time/a": 1 + 1e-9}
        assert r["gather_rows"] == {
            "ids": ["int64", [2**40, 1, 2**40 + 1, 1]],
            "f": ["float64", [0.1, 0.2]],
        }
        assert r["allgather_strings"] == STRINGS
        assert sum(r["allgather_strings"], []) == sum(one["allgather_strings"], [])
        assert r["export"] == one["export"] == [True, True]


def test_combine_rows_by_hand():
    from gdpo_jax.train.distributed import combine_rows

    table = np.array([[1.0, 0.5, 2.0], [3.0, 0.25, 0.0]])  # 2 processes x 3 keys
    out = combine_rows(
        table,
        ["reward_failures/a", "time/step_s", "reward_time/a"],
        max_prefixes=("time/", "reward_time/"),
    )
    assert out == {"reward_failures/a": 4.0, "time/step_s": 0.5, "reward_time/a": 2.0}


# What srun / mpirun (Open MPI 4, ORTE) set in each process of a 2-process job, and
# what an `salloc` shell or a plain `mpirun`-less shell holds.
_SRUN = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
}
_SALLOC = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_NNODES": "2"}
_MPIRUN = {
    "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.0.0.1:34911",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
}


def _cluster_env(monkeypatch, env: dict[str, str]) -> None:
    from gdpo_jax import multihost

    for k in list(os.environ):
        if k in multihost._ENV_HINTS or k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_")):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize(
    "env, cluster, multi",
    [
        ({}, None, False),
        (_SALLOC, None, False),  # JAX: "coordinator_address should be defined"
        (_SRUN, "slurm", True),
        ({**_SRUN, "SLURM_NTASKS": "1"}, "slurm", False),  # srun -n 1: one process
        ({"OMPI_COMM_WORLD_SIZE": "2"}, None, False),  # no ORTE URI (Open MPI 5)
        (_MPIRUN, "ompi", True),
        ({**_MPIRUN, "OMPI_COMM_WORLD_SIZE": "1"}, "ompi", False),
        ({"TPU_WORKER_HOSTNAMES": "localhost"}, None, False),  # the planner's
        ({"TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2"}, "tpu", True),
        ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, "jax", True),
    ],
)
def test_cluster_env_is_what_jax_detects(monkeypatch, env, cluster, multi):
    """An `salloc` shell's SLURM_JOB_ID (or OMPI_COMM_WORLD_SIZE alone) counted as a
    cluster; JAX finds no coordinator there, so a one-process run in it failed."""
    from gdpo_jax import multihost

    _cluster_env(monkeypatch, env)
    assert multihost.cluster_env() == cluster
    assert multihost.cluster_hint() is multi
    try:  # JAX's own detection (private; the code mirrors it without importing it)
        from jax._src.clusters import OmpiCluster, SlurmCluster
    except ImportError:
        return
    assert SlurmCluster.is_env_present() == (cluster == "slurm")
    assert OmpiCluster.is_env_present() == (cluster == "ompi")


def test_auto_initialize_in_an_salloc_shell_is_one_process(monkeypatch):
    from gdpo_jax.train import distributed

    called = []
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda **kw: called.append(kw))
    _cluster_env(monkeypatch, _SALLOC)
    assert distributed.initialize("auto") is False and not called
    _cluster_env(monkeypatch, {**_SRUN, "SLURM_NTASKS": "1"})
    assert distributed.initialize("auto") is False and not called
    _cluster_env(monkeypatch, _SRUN)  # a real 2-process step still initializes
    assert distributed.initialize("auto") is True and called == [{}]


def test_initialize_without_a_coordinator_says_what_to_set(monkeypatch):
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.train import distributed

    def no_cluster(**kw):
        raise ValueError("coordinator_address should be defined.")

    monkeypatch.setattr(distributed.jax.distributed, "initialize", no_cluster)
    with pytest.raises(ConfigError, match="set config.distributed.coordinator_address") as e:
        distributed.initialize("always")
    assert "\n" not in str(e.value)


def test_check_distributed_needs_an_address_in_an_salloc_shell(monkeypatch):
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.train.field_checks import check_distributed
    from gdpo_jax.train.schema import base_config

    cfg = base_config()
    cfg.distributed.num_processes = 2
    _cluster_env(monkeypatch, _SALLOC)  # JAX would find no coordinator here
    with pytest.raises(ConfigError, match="needs config.distributed.coordinator_address"):
        check_distributed(cfg)
    _cluster_env(monkeypatch, _SRUN)  # srun's step: JAX finds it
    check_distributed(cfg)


# What Open MPI 5's mpirun (PRRTE: no ORTE URI) and MPICH's mpiexec (Hydra, PMI) set in
# process 1 of a 2-process job: launches JAX 0.10 does not detect.
_MPIRUN5 = {
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "PMIX_NAMESPACE": "prterun-node1-4242@1",
}
_MPIEXEC_MPICH = {"PMI_SIZE": "2", "PMI_RANK": "1", "PMI_FD": "6"}


@pytest.mark.parametrize("env", [_MPIRUN5, _MPIEXEC_MPICH], ids=["open_mpi_5", "mpich"])
def test_an_mpi_launch_jax_does_not_detect_needs_an_address(monkeypatch, env):
    """Under Open MPI 5's mpirun or MPICH's mpiexec, "auto" found no cluster and each
    process trained alone, every one of them into the same workdir. Now the check and
    initialize both ask for the coordinator address, and with it the process count and
    index come from the launcher."""
    from gdpo_jax import multihost
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.train import distributed
    from gdpo_jax.train.field_checks import check_distributed
    from gdpo_jax.train.schema import base_config

    called = []
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda **kw: called.append(kw))
    _cluster_env(monkeypatch, env)
    assert multihost.cluster_env() is None and multihost.mpi_launch()[1:3] == (2, 1)
    cfg = base_config()
    want = "coordinator_address is needed: this is process 1 of 2 started by"
    with pytest.raises(ConfigError, match=want) as e:
        check_distributed(cfg)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=want):
        distributed.initialize("auto")
    assert not called
    cfg.distributed.coordinator_address = "10.0.0.1:1234"
    check_distributed(cfg)
    assert distributed.initialize("auto", coordinator_address="10.0.0.1:1234") is True
    assert called == [{"coordinator_address": "10.0.0.1:1234", "num_processes": 2, "process_id": 1}]
    cfg.distributed.coordinator_address = ""
    cfg.distributed.initialize = "never"  # each process alone, as asked
    check_distributed(cfg)
    assert distributed.initialize("never") is False
    # One process of such a launcher, and Open MPI 4 (which JAX detects), are as before.
    _cluster_env(monkeypatch, {**env, "OMPI_COMM_WORLD_SIZE": "1", "PMI_SIZE": "1"})
    assert multihost.mpi_launch() is None and distributed.initialize("auto") is False
    _cluster_env(monkeypatch, _MPIRUN)
    check_distributed(base_config())
    called.clear()
    assert distributed.initialize("auto") is True and called == [{}]


def _fake_processes(monkeypatch, index: int = 0) -> None:
    """2 processes as multihost sees them; process_allgather as the real one on equal
    inputs, through device_put (which keeps no 64-bit types without x64)."""
    import jax
    from jax.experimental import multihost_utils

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: index)
    monkeypatch.setattr(
        multihost_utils,
        "process_allgather",
        lambda x, tiled=False: np.stack([np.asarray(jax.device_put(x))] * 2),
    )


@pytest.mark.parametrize(
    "x",
    [
        np.asarray([2**31 + 5, -3], np.int64),
        np.asarray([[0.1, 16777217.0]]),
        np.float64(0.1),
        np.asarray([1.5, -2.0], "bfloat16"),
        np.asarray([[True], [False]]),
        np.zeros((0, 3), np.int64),
        np.arange(6, dtype=np.int64).reshape(2, 3).T,  # not contiguous
    ],
    ids=["int64", "float64", "scalar", "bf16", "bool", "empty", "strided"],
)
def test_allgather_keeps_dtype_and_values(monkeypatch, x):
    from gdpo_jax import multihost

    one = multihost.allgather(x)
    assert one.dtype == x.dtype and one.shape == (1,) + np.shape(x)
    _fake_processes(monkeypatch)
    two = multihost.allgather(x)
    assert two.dtype == x.dtype and two.shape == (2,) + np.shape(x)
    np.testing.assert_array_equal(two, np.concatenate([one, one]))


def test_allgather_strings_pass_lone_surrogates(monkeypatch):
    from gdpo_jax.train.distributed import allgather_strings

    texts = ["ok", "bad\udc80", "\ud83d\ude00", ""]
    assert allgather_strings(texts) == [texts]
    _fake_processes(monkeypatch)
    assert allgather_strings(texts) == [texts, texts]


def test_save_pretrained_waits_for_process_0(monkeypatch, tmp_path):
    """Process 1 returns the dir only once process 0 reports it written, and raises
    when process 0 failed (it used to return at once, before any file existed)."""
    from gdpo_jax.models import export
    from gdpo_jax.models.sharding import create_model
    from tests.test_train_step import CFG

    model = create_model(CFG)
    _fake_processes(monkeypatch, index=1)
    seen = []

    def gather(x):  # process 0's status first: it failed
        seen.append(bool(x))
        return np.asarray([False, bool(x)])

    monkeypatch.setattr(export, "allgather", gather, raising=False)
    with pytest.raises(RuntimeError, match="process 0 failed to export"):
        export.save_pretrained(model, None, str(tmp_path / "hf"))
    assert seen == [True] and not (tmp_path / "hf").exists()  # process 1 wrote nothing


def test_the_sft_cli_joins_the_cluster_before_building(monkeypatch, tmp_path):
    # `gdpo-sft` never called distributed.initialize: under srun each process trained
    # alone on what it took for its share of a global batch.
    from experiments import sft as sft_cli
    from gdpo_jax.train import distributed, sft_checks
    from gdpo_jax.train import sft as sft_lib

    order = []
    monkeypatch.setattr(distributed, "initialize_from_config", lambda cfg: order.append("init"))
    # The CLI's early config check counts the devices: it must come after the join too.
    monkeypatch.setattr(sft_checks, "validate_sft_config", lambda cfg: order.append("check"))

    class FakeSFT:
        def __init__(self, cfg):
            order.append("build")

        def run(self):
            return {}

    monkeypatch.setattr(sft_lib, "SFT", FakeSFT)
    cfg = sft_lib.sft_config()
    cfg.workdir = str(tmp_path)
    sft_cli._build_and_run(cfg)
    assert order == ["init", "check", "build"]
