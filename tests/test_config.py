"""Config validation: each bad field gives an error naming the field and the fix."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from gdpo_jax.train.config import (
    ConfigError,
    config_diff,
    fingerprint,
    reward_specs,
    validate_config,
)
from tests._train_fixtures import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cfg():
    return tiny_config("/tmp/unused")


def test_valid_configs_pass():
    validate_config(_cfg(), num_devices=8)
    sys.path.insert(0, ROOT)
    from configs import tiny_cpu

    for arg in ("", "runlocal"):
        c = tiny_cpu.get_config(arg)
        c.workdir = "/tmp/x"
        validate_config(c, num_devices=8)
        validate_config(c, num_devices=2)


@pytest.mark.parametrize(
    "mutate,pattern",
    [
        (
            lambda c: setattr(c.algo, "estimator", "gdpoo"),
            r"algo\.estimator='gdpoo'.*Did you mean 'gdpo'",
        ),
        (
            lambda c: setattr(c.rewards, "weights", (1.0, 2.0, 3.0)),
            r"rewards\.weights has 3 entries but config\.rewards\.names has 2",
        ),
        (lambda c: setattr(c.algo, "group_size", 1), r"algo\.group_size=1.*group_size=2 or more"),
        (
            lambda c: setattr(c.algo, "num_prompts", 3),
            r"micro-batch has 12 rows.*not divisible by the mesh's batch axes data x fsdp = 8",
        ),
        (
            lambda c: setattr(c.rewards, "names", ("test_short", "test_has_w11")),
            r"unknown reward 'test_has_w11'.*Did you mean 'test_has_w10'",
        ),
        (lambda c: setattr(c.task, "name", "tool_call"), r"task\.name='tool_call'.*Did you mean"),
        (lambda c: setattr(c.algo, "aggregation", "mean"), r"algo\.aggregation='mean'"),
        (
            lambda c: setattr(c.mesh, "shape", (3, -1, 1)),
            r"mesh\.shape=\(3, -1, 1\).*not divisible",
        ),
        (lambda c: setattr(c.mesh, "shape", (2, 2, 1)), r"mesh\.shape=\(2, 2, 1\) needs 4 devices"),
        (lambda c: setattr(c, "workdir", ""), r"workdir is empty"),
        (lambda c: setattr(c.rewards, "conditions", ("", "nope")), r"conditioned on 'nope'"),
        (
            lambda c: setattr(c.algo, "num_microbatches", 3),
            r"num_minibatches\*num_microbatches = 3",
        ),
        (
            lambda c: setattr(c.sampling, "rows_per_call", 6),
            r"sampling\.rows_per_call=6 must be 0 .* multiple of algo\.group_size=4"
            r".*rows_per_call=4\b",
        ),
        (
            lambda c: setattr(c.sampling, "rows_per_call", 12),
            r"sampling\.rows_per_call=12 .*divides algo\.num_prompts=4.*rows_per_call=8\b",
        ),
    ],
)
def test_bad_config_names_field(mutate, pattern):
    c = _cfg()
    c.mesh.num_devices = 0
    mutate(c)
    with pytest.raises(ConfigError, match=pattern):
        validate_config(c, num_devices=8)


def test_reward_specs_and_fingerprint():
    c = _cfg()
    c.rewards.conditions = ("", "test_has_w10")
    c.rewards.thresholds = (1.0, 0.5)
    specs = reward_specs(c)
    assert [s.name for s in specs] == ["test_has_w10", "test_short"]
    assert specs[1].condition == "test_has_w10" and specs[1].threshold == 0.5
    assert specs[0].condition is None and specs[0].weight == 1.0
    d = _cfg()
    d.train.num_steps = 999  # resumable: same fingerprint
    d.workdir = "/elsewhere"
    assert fingerprint(_cfg()) == fingerprint(d)
    d.algo.clip_high = 0.28
    assert fingerprint(_cfg()) != fingerprint(d)
    from gdpo_jax.train.config import config_to_dict

    assert config_diff(config_to_dict(_cfg()), d) == ["algo.clip_high"]


def test_cli_rejects_bad_config_with_message(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.train",
            "--config=configs/tiny_cpu.py",
            "--config.algo.estimator=gdpo_nobn",
            f"--config.workdir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "config.algo.estimator='gdpo_nobn'" in out.stderr
    assert "gdpo_no_bn" in out.stderr
    # A misspelled field is refused by the locked config.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.train",
            "--config=configs/tiny_cpu.py",
            "--config.algo.estimater=grpo",
            f"--config.workdir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and "estimater" in out.stderr


def test_kl_in_reward_under_gdpo_warns(caplog):
    # Under GDPO the penalty column is group-normalized like a task reward; the
    # user is told so, and GRPO (where it is summed before normalizing) is not.
    c = _cfg()
    c.algo.kl_in_reward = 0.001
    for est, warns in (("gdpo", True), ("gdpo_no_bn", True), ("grpo", False)):
        c.algo.estimator = est
        caplog.clear()
        with caplog.at_level("WARNING", logger="gdpo_jax.config"):
            validate_config(c, num_devices=8)
        assert any("kl_in_reward" in r.getMessage() for r in caplog.records) == warns, est


def test_checkpoint_config_from_before_a_new_field():
    # A checkpoint written before a field existed still resumes when the run
    # keeps that field's default, and is refused when the run changes it.
    from gdpo_jax.train.config import config_to_dict

    saved = config_to_dict(_cfg())
    del saved["algo"]["dual_clip"]  # stand-in for a field added later
    assert config_diff(saved, _cfg()) == []
    c = _cfg()
    c.algo.dual_clip = 3.0
    assert config_diff(saved, c) == ["algo.dual_clip"]
    c = _cfg()
    c.sampling.rows_per_call = 8  # memory knob: may change on resume
    assert config_diff(config_to_dict(_cfg()), c) == []


def test_reward_runner_from_config():
    # The runner's pools and chunking come from config.rewards.
    from gdpo_jax.train.config import reward_runner

    c = _cfg()
    c.rewards.executor = "thread"
    c.rewards.executors = ("", "process")
    c.rewards.chunk_size = 3
    c.rewards.num_workers = 2
    validate_config(c, num_devices=8)
    with reward_runner(c) as r:
        assert r._executors == ["thread", "process"]
        assert r.chunk_size == 3 and r.num_workers == 2
        vals, _ = r(["p"] * 4, ["w10 a", "b", "w10 c d e", "f g h i"], [{}] * 4)
        np.testing.assert_array_equal(vals, [[1, 1], [0, 1], [1, 0], [0, 0]])
    for field, value, pattern in (
        ("executor", "procs", r"rewards\.executor='procs'"),
        ("executors", ("thread",), r"rewards\.executors has 1 entries"),
        ("executors", ("", "gpu"), r"rewards\.executors: 'gpu'"),
        ("chunk_size", -1, r"rewards\.chunk_size=-1"),
    ):
        c = _cfg()
        setattr(c.rewards, field, value)
        with pytest.raises(ConfigError, match=pattern):
            validate_config(c, num_devices=8)
