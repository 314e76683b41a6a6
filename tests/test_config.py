"""Config validation: each bad field gives an error naming the field and the fix."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from gdpo_jax.train.config import (
    ConfigError,
    config_diff,
    fingerprint,
    reward_specs,
    validate_config,
)
from tests._importtime import modules_imported
from tests._subprocess import child_env
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


def test_smoke_configs_warm_up_for_fewer_steps_than_they_run():
    # The documented 4-step smoke runs (tiny_cpu, sft_toolcall, sft_math :runlocal)
    # warmed up for 5 or 10 steps, so every one printed the warmup warning.
    import glob
    import importlib

    sys.path.insert(0, ROOT)
    checked = []
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))):
        mod = importlib.import_module(f"configs.{os.path.basename(path)[:-3]}")
        if not hasattr(mod, "get_config") or "runlocal" not in open(path).read():
            continue
        try:
            c = mod.get_config("runlocal")
        except ValueError:  # a config naming runlocal only to refuse it
            continue
        steps = c.sft.num_steps if "sft" in c else c.train.num_steps
        assert c.optim.warmup_steps < steps, (path, c.optim.warmup_steps, steps)
        checked.append(os.path.basename(path))
    assert {"tiny_cpu.py", "sft_toolcall.py", "sft_math.py"} <= set(checked)


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
        (
            lambda c: setattr(c.rewards, "weights", (1.0, float("nan"))),
            r"rewards\.weights\[1\]=nan is not finite",
        ),
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
        (
            lambda c: setattr(c.sampling, "continuous_slots", -1),
            r"sampling\.continuous_slots=-1 must be >= 1 .*continuous_slots=0",
        ),
        (
            lambda c: setattr(c.sampling, "continuous_prompt_slots", -2),
            r"sampling\.continuous_prompt_slots=-2 must be >= 1 .*continuous_prompt_slots=0",
        ),
        (
            lambda c: setattr(c.sampling, "continuous_prompt_slots", 4),
            r"continuous_prompt_slots=4 .*needs sampling\.continuous_slots >= 1 \(is 0\)",
        ),
        (
            lambda c: setattr(c.sampling, "decode_layers", "unroll"),
            r"sampling\.decode_layers='unroll' must be one of .*decode_layers=auto",
        ),
        (
            lambda c: setattr(c.sampling, "decode_growth", "pad"),
            r"sampling\.decode_growth='pad' must be one of .*decode_growth=auto",
        ),
        (
            lambda c: setattr(c.sampling, "decode_phases", -1),
            r"sampling\.decode_phases=-1 must be an int >= 1 .*decode_phases=0",
        ),
        (
            lambda c: setattr(c.model, "attention", "cudnn"),
            r"model\.attention='cudnn' needs a GPU.*attention=auto",
        ),
        (
            lambda c: setattr(c.model, "attention", "splash"),
            r"model\.attention='splash' is the Pallas TPU kernel.*attention=auto",
        ),
        (
            lambda c: setattr(c.model, "attention", "flash"),
            r"model\.attention='flash' is not one of .*splash.*Set --config\.model\.attention=",
        ),
        (
            lambda c: setattr(c.model, "remat_policy", "dot"),
            r"model\.remat_policy='dot' is not one of \('full', 'dots'\).*remat_policy=",
        ),
        (  # a policy without remat changes nothing: say so before the run
            lambda c: setattr(c.model, "remat_policy", "dots"),
            r"model\.remat_policy='dots' is read only with model\.remat=True; set "
            r"--config\.model\.remat=True",
        ),
        (  # checked up front (it failed in the model build, after the work had started)
            lambda c: setattr(c.model, "dtype", "bf16"),
            r"config\.model\.dtype='bf16' is not a supported dtype.*Set --config\.model\.dtype=",
        ),
        (
            lambda c: setattr(c.model, "param_dtype", "float64"),
            r"config\.model\.param_dtype='float64' is not a supported dtype; use one of",
        ),
        (  # accepted, AdamW's first update turned every weight NaN (rc 0, NaN export)
            lambda c: setattr(c.model, "param_dtype", "half"),
            r"config\.model\.param_dtype='float16': AdamW's moments and eps underflow",
        ),
        (
            lambda c: setattr(c.sampling, "prompt_buckets", (4, 6)),
            r"sampling\.prompt_buckets=\(4, 6\) must .*end at sampling\.max_prompt_len=8",
        ),
        (
            lambda c: setattr(c.sampling, "prompt_buckets", (4, 4, 8)),
            r"sampling\.prompt_buckets=\(4, 4, 8\) must .*ascend strictly",
        ),
        (  # int() truncated them to (4, 8) without a word
            lambda c: setattr(c.sampling, "prompt_buckets", (4.5, 8)),
            r"sampling\.prompt_buckets=\(4\.5, 8\) must be whole numbers of tokens",
        ),
        (  # and (8,): it even passed as ending at max_prompt_len=8
            lambda c: setattr(c.sampling, "prompt_buckets", (8.7,)),
            r"sampling\.prompt_buckets=\(8\.7,\) must be whole numbers",
        ),
    ],
)
def test_bad_config_names_field(mutate, pattern):
    c = _cfg()
    c.mesh.num_devices = 0
    mutate(c)
    with pytest.raises(ConfigError, match=pattern):
        validate_config(c, num_devices=8)


def _set(path: str, value):
    """A mutation for test_bad_input_fails_in_validation: config.<path> = value."""

    def mutate(c):
        *parents, leaf = path.split(".")
        node = c
        for p in parents:
            node = node[p]
        with node.unlocked():  # a tuple where a float was, as a config file may write
            node[leaf] = value

    return mutate


@pytest.mark.parametrize(
    "mutate,pattern",
    [
        # Each of these was accepted by validation and failed after the work had started
        # (in the model build, a jitted step, the optimizer, the reward runner or an Orbax
        # save), or ran doing something else than asked.
        (  # the ZeroDivisionError in the toy generator; the test config's task takes none
            lambda c: (
                _set("task.name", "toy_toolcall")(c),
                _set("task.kwargs", {"num_tools": 0})(c),
            ),
            r"config\.task\.kwargs\.num_tools=0: task 'toy_toolcall' needs an int",
        ),
        (_set("model.tiny.hidden_size", 0), r"config\.model\.tiny: hidden_size=0 must be >= 1"),
        (_set("model.tiny.num_layers", 0), r"config\.model\.tiny: num_layers=0 must be >= 1"),
        (_set("model.tiny.num_kv_heads", 0), r"config\.model\.tiny: num_kv_heads=0 must be"),
        (_set("model.tiny.head_dim", 31), r"config\.model\.tiny: head_dim=31 must be even"),
        (_set("algo.max_len", -1), r"config\.algo\.max_len=-1 must be an int >= 0 \(0 = "),
        (_set("algo.logprob_chunk_size", -4), r"algo\.logprob_chunk_size=-4 must be an int >= 0"),
        (_set("algo.clip_low", 1.5), r"algo\.clip_low=1\.5 must be a number in \[0, 1\)"),
        (_set("algo.nan_rewards", "nan"), r"config\.algo\.nan_rewards='nan'"),
        (_set("algo.beta", float("nan")), r"config\.algo\.beta=nan must be a number >= 0"),
        (_set("algo.eps", float("nan")), r"config\.algo\.eps=nan must be"),
        (_set("algo.dual_clip", float("nan")), r"config\.algo\.dual_clip=nan must be > 1"),
        (_set("algo.dynamic_sampling_max_tries", 0), r"dynamic_sampling_max_tries=0 must be"),
        (
            _set("optim.min_lr_ratio", -1.0),
            r"optim\.min_lr_ratio=-1\.0 must be a number in \[0, 1\]",
        ),
        (_set("optim.min_lr_ratio", 2.0), r"optim\.min_lr_ratio=2\.0 must be"),
        (_set("optim.warmup_steps", -5), r"optim\.warmup_steps=-5 must be an int >= 0"),
        (_set("optim.max_grad_norm", -1.0), r"optim\.max_grad_norm=-1\.0 must be .*no clipping"),
        (_set("optim.lr", float("inf")), r"config\.optim\.lr=inf must be a number > 0"),
        (_set("optim.lr", float("nan")), r"config\.optim\.lr=nan must be a number > 0"),
        (_set("optim.weight_decay", -0.1), r"optim\.weight_decay=-0\.1 must be"),
        (_set("optim.b1", 1.5), r"optim\.b1=1\.5 must be a number in \[0, 1\)"),
        (_set("optim.b2", -0.1), r"optim\.b2=-0\.1 must be"),
        (_set("optim.eps", -1e-8), r"optim\.eps=-1e-08 must be"),
        (_set("checkpoint.keep", 0), r"checkpoint\.keep=0 must be an int >= 1"),
        (_set("checkpoint.every", -1), r"checkpoint\.every=-1 must be an int >= 0 \(0 = no"),
        (_set("train.log_every", 0), r"train\.log_every=0 must be an int >= 1"),
        (_set("train.eval_every", -1), r"train\.eval_every=-1 must be"),
        (_set("train.stop_after_step", -1), r"train\.stop_after_step=-1 must be"),
        (_set("train.eval_num_examples", -1), r"train\.eval_num_examples=-1 must be"),
        (_set("eval.num_samples", 0), r"eval\.num_samples=0 must be an int >= 1"),
        (_set("task.num_eval", -5), r"task\.num_eval=-5 must be"),
        (_set("task.num_train", 0), r"task\.num_train=0: a synthetic source generates"),
        (_set("rewards.num_workers", 0), r"rewards\.num_workers=0 must be an int >= 1"),
        (_set("rewards.timeout_s", 0.0), r"rewards\.timeout_s=0\.0 must be a number > 0"),
        (_set("rewards.chunk_size", -1), r"rewards\.chunk_size=-1 must be an int >= 0"),
        (_set("sampling.temperature", float("nan")), r"sampling\.temperature=nan must be > 0"),
        (_set("sampling.top_p", 1.5), r"config\.sampling\.top_p=1\.5 must be in \(0, 1\]"),
        (_set("sampling.top_k", -3), r"config\.sampling\.top_k=-3 must be >= 0"),
        (_set("sampling.stop_strings", ("",)), r"config\.sampling\.stop_strings must not"),
        (_set("eval.temperature", -1.0), r"config\.eval\.temperature=-1\.0 must be finite and >="),
        (_set("sampling.temperature", float("inf")), r"sampling\.temperature=inf must be finite"),
        (_set("eval.top_p", 2.0), r"config\.eval\.top_p=2\.0 must be in \(0, 1\]"),
        (_set("rewards.weights", ("a", "b")), r"rewards\.weights\[0\]='a' is not finite"),
        (
            _set("rewards.thresholds", (1.0, float("nan"))),
            r"rewards\.thresholds\[1\]=nan is not finite",
        ),
        # A threshold of a reward without a condition was ignored: a gate that did not exist.
        (
            _set("rewards.thresholds", (1.0, 0.5)),
            r"rewards\.thresholds\[1\]=0\.5 is for reward 'test_short', which has no condition",
        ),
        (
            _set("rewards.conditions", ("test_short", "test_has_w10")),
            r"conditions form a cycle \(test_has_w10 -> test_short -> test_has_w10\)",
        ),
        (_set("distributed.initialize", "bogus"), r"distributed\.initialize='bogus' is not"),
        # Both failed after the model build (the prompt stream's seed) or ran on in silence.
        (_set("seed", -1), r"config\.seed=-1 must be an int in \[0, 4294967295\]"),
        (_set("seed", 2**32), r"config\.seed=4294967296 must be"),
        (
            _set("eval.num_samples", 4),
            r"eval\.num_samples=4 with eval\.greedy=True repeats one completion",
        ),
        (_set("distributed.num_processes", -3), r"distributed\.num_processes=-3 must be"),
        (
            _set("distributed.num_processes", 2),
            r"num_processes=2 needs config\.distributed\.coordinator_address",
        ),
    ],
)
def test_bad_input_fails_in_validation(mutate, pattern):
    c = _cfg()
    mutate(c)
    with pytest.raises(ConfigError, match=pattern) as e:
        validate_config(c, num_devices=1)
    assert "\n" not in str(e.value)  # one line


def test_ranges_table_names_real_fields_whose_defaults_pass():
    from gdpo_jax.train.field_checks import RANGES, check_ranges
    from gdpo_jax.train.schema import _get, base_config

    c = base_config()
    for r in RANGES:
        assert r.holds(_get(c, r.field)), r.field  # a default outside its range: a typo
    check_ranges(c)


def test_workdir_that_is_a_file_and_model_dir_without_weights(tmp_path):
    from gdpo_jax.train import paths

    c = _cfg()
    (tmp_path / "afile").write_text("x")
    c.workdir = str(tmp_path / "afile")
    with pytest.raises(ConfigError, match=r"workdir=.*afile' is a file, not a directory"):
        validate_config(c, num_devices=1)
    c = _cfg()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    c.model.name = str(model)
    with pytest.raises(ConfigError, match=r"model\.name=.*holds no \*\.safetensors weights"):
        paths.check_inputs(c)


def test_a_workdir_starting_with_a_tilde_is_refused(tmp_path, monkeypatch):
    # "--config.workdir=~/run": the shell leaves the "~" (it follows "="), and the run
    # wrote into ./~/run while its logs said ~/run.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    c = _cfg()
    c.workdir = "~/run"
    with pytest.raises(ConfigError, match=r"config\.workdir='~/run' starts with '~'") as e:
        validate_config(c, num_devices=1)
    assert f"config.workdir={tmp_path}/home/run" in str(e.value)
    assert not (tmp_path / "~").exists()


def test_an_existing_workdir_that_is_not_writable_is_refused(tmp_path, monkeypatch):
    # Only a missing workdir's parent was checked: an existing read-only one (a read-only
    # mount) failed with a traceback when config.json was written.
    c = _cfg()
    c.workdir = str(tmp_path / "ro")
    (tmp_path / "ro").mkdir()
    validate_config(c, num_devices=1)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if p == c.workdir else real(p, m))
    with pytest.raises(ConfigError, match=r"config\.workdir=.*ro' is not writable") as e:
        validate_config(c, num_devices=1)
    assert "\n" not in str(e.value)


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


@pytest.mark.parametrize(
    "cmd, bad, checks",
    [
        (
            ["experiments.train", "--config=configs/tiny_cpu.py"],
            "--config.algo.group_size=1",
            "gdpo_jax.train.resume_checks",
        ),
        (
            ["experiments.sft", "--config=configs/sft_toolcall.py"],
            "--config.model.dtype=float33",
            "gdpo_jax.train.sft_checks",
        ),
    ],
)
def test_cli_refuses_a_bad_config_before_importing_the_trainers_libraries(
    cmd, bad, checks, tmp_path
):
    """A refused config costs little more than the CLI's start: neither CLI imports
    its trainer, the checkpointer, orbax or grain before its checks. The train CLI's
    resume check imported the checkpointer at its top (and with it orbax and the train
    state); the SFT config file imported `sft_config` from the SFT trainer, and the CLI
    checked the config only in the trainer's constructor. The checks read the model's
    config, and `gdpo_jax.models` imported its transformer, and with it flax and optax,
    on the way (about 0.5 s): its names now load on first use."""
    mods = modules_imported(["-m", *cmd, bad, f"--config.workdir={tmp_path}/w"], tmp_path)
    assert checks in mods and "jax._src.core" in mods and "gdpo_jax.models.config" in mods
    heavy = [m for m in mods if m.split(".")[0] in ("orbax", "grain", "flax", "optax")]
    trainers = {"gdpo_jax.train.checkpoint", "gdpo_jax.train.state", "gdpo_jax.train.loop"}
    assert heavy == [] and trainers.isdisjoint(mods) and "gdpo_jax.train.sft" not in mods
    assert not os.path.exists(tmp_path / "w")  # and nothing written


def test_kl_in_reward_is_valid_for_every_estimator(caplog):
    # The penalty no longer becomes a GDPO reward column (it is added after the
    # per-reward normalization), so no estimator is warned about any more.
    c = _cfg()
    c.algo.kl_in_reward = 0.001
    for est in ("gdpo", "gdpo_no_bn", "grpo"):
        c.algo.estimator = est
        caplog.clear()
        with caplog.at_level("WARNING", logger="gdpo_jax.config"):
            validate_config(c, num_devices=8)
        assert not any("kl_in_reward" in r.getMessage() for r in caplog.records), est


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
    c.sampling.rows_per_call = 8  # memory knobs: may change on resume
    c.sampling.decode_phases = 1
    c.sampling.decode_growth = "copy"
    # A run moved to another allocation: an explicit mesh.shape had to be resumed with
    # allow_config_change, which switched every other check off too.
    c.mesh.shape, c.mesh.axis_types, c.mesh.num_devices = (2, 2, 2), "auto", 8
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


def _toy_cfg():
    c = _cfg()
    c.task.name = "toy_toolcall"
    c.rewards.names = ("toy_format", "toy_correct", "toy_length")
    return c


def test_misspelled_reward_kwarg_names_reward_key_and_valid_keys():
    # Before the fix max_wrods was accepted and silently ignored by the reward's **kw.
    c = _toy_cfg()
    c.rewards.kwargs.toy_length = dict(max_words=2)
    validate_config(c, num_devices=8)
    c.rewards.kwargs.toy_length = dict(max_wrods=1)
    with pytest.raises(
        ConfigError,
        match=r"rewards\.kwargs\.toy_length: reward 'toy_length' takes no keyword argument\(s\) "
        r"\['max_wrods'\]; valid keys: \['max_words'\]",
    ):
        validate_config(c, num_devices=8)
    # A reward with no options at all, and the runner-supplied fields, are not settable.
    c = _toy_cfg()
    c.rewards.kwargs.toy_format = dict(scale=2)
    with pytest.raises(ConfigError, match=r"'toy_format'.*\['scale'\]; valid keys: \[\]"):
        validate_config(c, num_devices=8)


def test_reward_options_from_signature_and_declared():
    from gdpo_jax.rewards.registry import check_reward_kwargs, reward_options

    assert reward_options("length") == ("max_tokens",)  # completion_lengths is the trainer's
    assert reward_options("toy_correct") == ()  # tool/args are data fields (no default)
    code = reward_options("code_pass_rate")  # read from **kwargs, declared at registration
    assert {"isolation", "max_tests", "cpu_s", "wall_s"} <= set(code)
    check_reward_kwargs("code_bug", {"max_tests": 3})
    # config.rewards.kwargs.<code reward> may override config.rewards.sandbox per reward
    # (both keys reach the sandbox as reward kwargs); allow_weak was not declared.
    check_reward_kwargs("code_pass_rate", {"isolation": "rlimits", "allow_weak": True})
    with pytest.raises(ValueError, match=r"'code_bug'.*\['max_test'\]"):
        check_reward_kwargs("code_bug", {"max_test": 3})


def test_context_longer_than_model_positions_is_rejected(tmp_path):
    import json

    c = _cfg()
    c.model.tiny.max_position_embeddings = 14
    c.sampling.max_prompt_len, c.sampling.max_new_tokens = 8, 6
    validate_config(c, num_devices=8)  # 14 fits exactly
    c.sampling.max_new_tokens = 7
    pat = (
        r"sampling\.max_prompt_len=8 \+ config\.sampling\.max_new_tokens=7 = 15 exceeds the "
        r"model's context of 14 positions"
    )
    with pytest.raises(ConfigError, match=pat):
        validate_config(c, num_devices=8)
    # A pretrained checkpoint dir: read from its config.json before any weights load.
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 14}))
    c.model.name = str(tmp_path)
    c.model.tiny = {}
    with pytest.raises(ConfigError, match=pat):
        validate_config(c, num_devices=8)
    # Left out, it is the model type's default, as the model reads it: a Qwen2 config.json
    # without it has transformers' 32768 positions, not the generic 2048.
    c.sampling.max_prompt_len, c.sampling.max_new_tokens = 4000, 100
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    validate_config(c, num_devices=8)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match="exceeds the model's context of 2048 positions"):
        validate_config(c, num_devices=8)


def test_the_context_check_counts_the_positions_rope_scaling_adds(tmp_path):
    # The check capped every model at max_position_embeddings, so Qwen2.5's documented
    # 131072-token yarn setting (max_position_embeddings=32768, factor 4) was refused.
    import json

    c = _cfg()
    c.model.tiny.max_position_embeddings = 16
    c.model.tiny.rope_scaling = {"rope_type": "linear", "factor": 2.0}
    c.sampling.max_prompt_len, c.sampling.max_new_tokens = 24, 8
    validate_config(c, num_devices=8)  # 16 x 2 = 32 fits exactly
    c.sampling.max_new_tokens = 9
    with pytest.raises(ConfigError, match="context of 32 positions"):
        validate_config(c, num_devices=8)
    qwen = {"model_type": "qwen2", "max_position_embeddings": 32768}
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    c.model.name, c.model.tiny = str(tmp_path), {}
    c.sampling.max_prompt_len, c.sampling.max_new_tokens = 2048, 129024
    (tmp_path / "config.json").write_text(json.dumps({**qwen, "rope_scaling": yarn}))
    validate_config(c, num_devices=8)  # 2048 + 129024 = 131072
    c.sampling.max_new_tokens += 1
    with pytest.raises(ConfigError, match="context of 131072 positions"):
        validate_config(c, num_devices=8)
    # Without rope scaling the same checkpoint serves 32768.
    (tmp_path / "config.json").write_text(json.dumps(qwen))
    with pytest.raises(ConfigError, match="context of 32768 positions"):
        validate_config(c, num_devices=8)


@pytest.mark.parametrize(
    "max_positions,rope,expected",
    [
        (2048, {}, 2048),
        (2048, {"rope_type": "linear", "factor": 4.0}, 8192),
        # yarn: factor x the trained length (DeepSeek-style configs already carry it).
        (
            32768,
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
            131072,
        ),
        (
            163840,
            {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
            163840,
        ),
        (4096, {"rope_type": "yarn", "factor": 2.0}, 8192),
        # llama3's max_position_embeddings is already the extended length (Llama 3.1).
        (
            131072,
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            131072,
        ),
    ],
)
def test_model_context_length_follows_the_rope_scaling(max_positions, rope, expected):
    from gdpo_jax.models.config import ModelConfig

    cfg = ModelConfig.tiny(max_position_embeddings=max_positions, rope_scaling=rope or None)
    assert cfg.context_length == expected


def test_sandbox_settings_reach_the_code_rewards_and_weak_mode_is_refused(monkeypatch):
    # Issue #13 item 8: config.rewards.sandbox; checked before any work starts.
    from gdpo_jax.rewards import isolation as isolation_mod
    from gdpo_jax.rewards import sandbox

    c = _cfg()
    c.rewards.names = ("code_pass_rate", "test_short")
    c.rewards.kwargs = {"code_pass_rate": {"cpu_s": 1}}
    specs = reward_specs(c)
    assert specs[0].kwargs == {"isolation": "auto", "allow_weak": False, "cpu_s": 1}
    assert specs[1].kwargs == {}
    monkeypatch.setattr(isolation_mod, "_probe", lambda cmd: False)
    sandbox.isolation.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"config\.rewards\.sandbox: .*allow_weak=True") as e:
            validate_config(c, num_devices=8)
        # One field name, then the reason (it read "config.rewards.sandbox: sandbox: ...").
        assert str(e.value).startswith("config.rewards.sandbox: the strongest isolation")
        c.rewards.sandbox.allow_weak = True
        validate_config(c, num_devices=8)
        c.rewards.sandbox.allow_weak = False
        # Naming a weak mode is the opt-in (root: setuid; rlimits is refused to root).
        c.rewards.sandbox.isolation = "setuid" if os.geteuid() == 0 else "rlimits"
        validate_config(c, num_devices=8)
        c.rewards.sandbox.isolation = "chroot"
        with pytest.raises(ConfigError, match=r"rewards\.sandbox\.isolation='chroot'"):
            validate_config(c, num_devices=8)
    finally:
        sandbox.isolation.cache_clear()


def test_a_sandbox_that_cannot_set_up_is_a_config_error(tmp_path, monkeypatch):
    # A set-up the machine refuses (pivot_root under Docker's seccomp profile was one)
    # made every program a sandbox_error: NaN code rewards, seen only once training ran.
    from gdpo_jax.rewards import sandbox

    driver = tmp_path / "driver.py"
    driver.write_text("print(repr({'setup_error': 'OSError: mount refused'}), flush=True)\n")
    c = _cfg()
    c.rewards.names = ("code_pass_rate", "test_short")
    monkeypatch.setattr(sandbox, "_DRIVER", str(driver))
    sandbox.self_check.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"config\.rewards\.sandbox: a trivial program .*"
                           r"mount refused"):  # fmt: skip
            validate_config(c, num_devices=8)
    finally:
        sandbox.self_check.cache_clear()


def test_custom_rewards_by_import_path_and_config_imports(tmp_path, monkeypatch):
    # Issue #14 item 3: no config file needed to add a reward.
    (tmp_path / "gdpo_cfg_rewards.py").write_text(
        "from gdpo_jax.rewards import register_reward\n"
        "def no_filler(prompts, completions, **kw):\n"
        "    return [1.0] * len(completions)\n"
        "@register_reward('gdpo_cfg_registered')\n"
        "def registered(prompts, completions, **kw):\n"
        "    return [0.5] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    c = _cfg()
    c.rewards.names = ("gdpo_cfg_registered", "test_short")
    with pytest.raises(ConfigError, match="unknown reward 'gdpo_cfg_registered'.*config.imports"):
        validate_config(c, num_devices=8)
    c.imports = ("gdpo_cfg_rewards",)
    validate_config(c, num_devices=8)
    c.rewards.names = ("gdpo_cfg_registered", "gdpo_cfg_rewards:no_filler")
    validate_config(c, num_devices=8)
    from gdpo_jax.train.config import reward_runner

    with reward_runner(c) as r:
        assert r.imports == ("gdpo_cfg_rewards",)
        vals, _ = r(["p"], ["w10 a"], [{}])
    np.testing.assert_array_equal(vals, [[0.5, 1.0]])
    c.rewards.names = ("gdpo_cfg_registered", "test_short")
    c.imports = ("gdpo_cfg_no_such_module",)
    with pytest.raises(ConfigError, match=r"config\.imports: importing 'gdpo_cfg_no_such_module'"):
        validate_config(c, num_devices=8)
    c.imports = ()
    c.rewards.names = ("gdpo_cfg_missing_mod:fn", "test_short")
    with pytest.raises(ConfigError, match="cannot import module 'gdpo_cfg_missing_mod'"):
        validate_config(c, num_devices=8)


def test_failed_task_import_names_its_cause(monkeypatch):
    # Issue #13 item 13: `except ImportError: pass` made it "not a registered task".
    from gdpo_jax import tasks

    monkeypatch.setitem(sys.modules, "gdpo_jax.tasks.sources", None)
    with pytest.raises(ImportError, match=r"built-in tasks \(gdpo_jax\.tasks\.sources\)"):
        tasks.list_tasks()
    with pytest.raises(ConfigError, match=r"config\.task\.name: importing the built-in tasks"):
        validate_config(_cfg(), num_devices=8)


def test_tokenizer_fails_at_its_cause(monkeypatch):
    # synthetic_bpe is known to the trainer without importing gdpo_jax.data.tokenizer.
    code = (
        "import sys; from gdpo_jax.data import tokenizer_registry\n"
        "assert tokenizer_registry.tokenizer_known('synthetic_bpe')\n"
        "assert 'gdpo_jax.data.tokenizer' not in sys.modules\n"
    )
    env = child_env()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    c = _cfg()
    c.model.tokenizer = "no_such_tokenizer"
    with pytest.raises(ConfigError, match=r"config\.model\.tokenizer='no_such_tokenizer'"):
        validate_config(c, num_devices=8)
    # A checkpoint without tokenizer files: at build time, not in the sampler.
    import gdpo_jax.models
    from gdpo_jax.train import build

    model = types.SimpleNamespace(cfg=gdpo_jax.models.ModelConfig.tiny())  # a stand-in
    monkeypatch.setattr(gdpo_jax.models, "load_pretrained", lambda *a, **k: (model, None))
    c = _cfg()
    c.model.name = "/ckpt/no_tokenizer"
    c.model.tokenizer = ""
    with pytest.raises(ValueError, match=r"config\.model\.name='/ckpt/no_tokenizer' came without"):
        build.build_model(c, None)
    c.model.tokenizer = "test_tiny"  # the fix the message names
    assert build.build_model(c, None)[1] is not None


def test_a_directory_without_tokenizer_files_or_of_another_architecture_is_refused(tmp_path):
    # Both passed validation and failed in the build with a traceback: any directory was
    # a tokenizer, and any config.json with weights a model the loader builds.
    from gdpo_jax.train import paths

    empty = tmp_path / "empty"
    empty.mkdir()
    c = _cfg()
    c.model.tokenizer = str(empty)
    with pytest.raises(ConfigError, match=r"config\.model\.tokenizer=.*nor a tokenizer dir"):
        validate_config(c, num_devices=1)
    (empty / "tokenizer.json").write_text("{}")  # a tokenizer directory now
    validate_config(c, num_devices=1)
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text('{"model_type": "gpt2"}')
    (gpt2 / "model.safetensors").write_bytes(b"")
    c = _cfg()
    c.model.name = str(gpt2)
    with pytest.raises(ConfigError, match=r"is a 'gpt2' checkpoint; the loader builds \["):
        paths.check_inputs(c)
    (gpt2 / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="does not read as a JSON object"):
        paths.check_inputs(c)


def test_model_scan_layers_reaches_the_model_and_the_planner():
    """config.model.scan_layers=False builds an unrolled model (build.build_model)
    and plans one (scale.arch.model_config); the default keeps the scan."""
    from gdpo_jax.scale.arch import model_config
    from gdpo_jax.train import build

    c = _cfg()
    c.model.tokenizer = "test_tiny"
    assert build.build_model(c, None)[0].cfg.scan_layers is True
    c.model.scan_layers = False
    assert build.build_model(c, None)[0].cfg.scan_layers is False
    assert model_config(c).scan_layers is False


def test_model_remat_policy_reaches_the_model_and_the_planner():
    """config.model.remat_policy builds a model that keeps what it names
    (build.build_model) and plans one (scale.arch.model_config)."""
    from gdpo_jax.scale.arch import model_config
    from gdpo_jax.train import build

    c = _cfg()
    c.model.tokenizer = "test_tiny"
    assert build.build_model(c, None)[0].cfg.remat_policy == "full"
    c.model.remat, c.model.remat_policy = True, "dots"
    validate_config(c, num_devices=8)
    assert build.build_model(c, None)[0].cfg.remat_policy == "dots"
    assert model_config(c).remat_policy == "dots"


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, "-m", "experiments.train", "--config=configs/tiny_cpu.py:runlocal", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_refuses_changed_resume_and_bad_distributed_fields_before_any_work(tmp_path):
    """A resume whose config differs from its checkpoint's is refused in one line before
    config.json is written (it was refused in the restore, after the model build, with
    config.json already replaced by the rejected config); config.distributed.* is checked
    before the multi-host set-up reads it."""
    import jax
    import numpy as np

    from configs import tiny_cpu
    from gdpo_jax.train import logs
    from gdpo_jax.train.checkpoint import Checkpointer
    from gdpo_jax.train.resume_checks import check_resume_config

    wd = tmp_path / "run"
    cfg = tiny_cpu.get_config("runlocal")
    cfg.workdir = str(wd)
    logs.save_config(cfg)
    ckpt = Checkpointer.from_config(cfg)
    ckpt.save(2, {"w": np.zeros(2, np.float32)}, key=jax.random.key(0), force=True)
    ckpt.close()
    check_resume_config(cfg)  # the same config resumes
    saved = (wd / "config.json").read_text()

    out = _cli(f"--config.workdir={wd}", "--config.algo.clip_high=0.3")
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    want = f"algo.clip_high: checkpoint={cfg.algo.clip_high!r} now=0.3"
    assert f"written with a different config: {want}" in last
    assert "allow_config_change=True" in last
    assert (wd / "config.json").read_text() == saved  # the record of the run is kept
    assert sorted(os.listdir(wd / "checkpoints")) == ["2"]  # nothing else written

    out = _cli(f"--config.workdir={tmp_path / 'other'}", "--config.distributed.initialize=bogus")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "config.distributed.initialize='bogus' is not one of" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "other").exists()


def test_unknown_task_kwarg_names_the_field():
    """A task.kwargs key the generator does not take: a ConfigError naming the field (it
    was a TypeError from inside the generator, raised after the model build)."""
    from gdpo_jax import tasks

    c = _cfg()
    c.task.name, c.task.source, c.task.num_train, c.task.num_eval = "toolcall", "synthetic", 4, 2
    c.task.chat_template = True  # its prompts are chat messages
    c.task.kwargs.n_tools = 3
    assert len(tasks.load_task(c).train) == 4  # a key the generator takes
    c.task.kwargs.bogus = 1
    with pytest.raises(ConfigError, match=r"config\.task\.kwargs: task 'toolcall' .*'bogus'"):
        tasks.load_task(c)


def test_sft_and_rl_configs_are_refused_by_the_other_and_rl_fields_by_sft(tmp_path):
    # experiments.train ran an SFT config as RL (its sft section unread);
    # experiments.sft on an RL config raised AttributeError 'sft'; SFT ran on past
    # --config.train.num_steps=1 (sft.num_steps steps) and --config.algo.estimator.
    from gdpo_jax.train.sft import sft_config
    from gdpo_jax.train.sft_checks import validate_sft_config

    rl = tiny_config(str(tmp_path))
    validate_config(rl)
    with pytest.raises(ConfigError, match=r"no 'sft' section: it is an RL config"):
        validate_sft_config(rl)
    sft = sft_config()
    sft.workdir, sft.model.tokenizer = str(tmp_path), rl.model.tokenizer
    sft.train.tensorboard = sft.train.progress_bar = False  # read by SFT
    validate_sft_config(sft)
    with pytest.raises(ConfigError, match=r"has an 'sft' section: .*experiments\.sft"):
        validate_config(sft)
    for field, value, want in (
        ("train.num_steps", 1, r"train\.num_steps=1 is an RL field .*set config\.sft\.num_steps"),
        ("algo.estimator", "grpo", r"algo\.estimator='grpo' is an RL field .*remove the"),
        ("eval.num_samples", 8, r"set config\.sft\.eval_samples instead"),
    ):
        bad = copy.deepcopy(sft)
        section, key = field.split(".")
        bad[section][key] = value
        with pytest.raises(ConfigError, match=want):
            validate_sft_config(bad)


def test_a_mesh_that_leaves_a_process_out_is_refused(monkeypatch, tmp_path):
    """With several processes, mesh.num_devices must give each an equal share: a
    process left out built the model, failed alone at its first rollout and every
    process hung (the tiny configs' num_devices=1 on 2 processes). The batch axes
    must split over the processes too. RL and SFT."""
    import jax

    from gdpo_jax.train.sft import sft_config
    from gdpo_jax.train.sft_checks import validate_sft_config

    class Dev:
        def __init__(self, p: int) -> None:
            self.process_index = p

    devices = [Dev(0), Dev(0), Dev(1), Dev(1)]
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "device_count", lambda: 4)
    monkeypatch.setattr(jax, "devices", lambda *a: devices)
    c = tiny_config(str(tmp_path))
    c.algo.num_prompts = 2
    c.mesh.shape = (-1, 1, 1)
    for n, ok in ((1, False), (2, False), (3, False), (4, True), (0, True)):
        c.mesh.num_devices = n
        if ok:
            validate_config(c)
        else:
            with pytest.raises(
                ConfigError, match=rf"num_devices={n} gives the 2 processes unequal"
            ):
                validate_config(c)
    sft = sft_config()
    sft.workdir, sft.model.tokenizer = str(tmp_path), c.model.tokenizer
    sft.mesh.num_devices = 1
    with pytest.raises(ConfigError, match="use 0 \\(all devices\\)"):
        validate_sft_config(sft)
    # Batch axes that do not split over the processes (tensor across them): refused
    # before the build, where the sampler refused them after it. RL and SFT.
    c.mesh.num_devices = sft.mesh.num_devices = 0
    for shape, ok in (((1, 1, -1), False), ((1, 2, 2), True), ((2, 1, 2), True)):
        c.mesh.shape = sft.mesh.shape = shape
        for check, cfg in ((validate_config, c), (validate_sft_config, sft)):
            if ok:
                check(cfg)
            else:
                with pytest.raises(ConfigError, match=r"data x fsdp = 1 do not split over the 2"):
                    check(cfg)


def test_cli_stops_a_diverged_run_with_one_line_and_status_1(tmp_path):
    # A diverged update ran on to exit 0 with NaN weights; the loop's refusal is a
    # one-line error, not a traceback (test_train_loop checks what is kept).
    out = _cli(
        f"--config.workdir={tmp_path / 'run'}",
        "--config.optim.lr=1e39",
        "--config.train.num_steps=2",
        "--config.train.eval_every=0",
    )
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: step 1: 2 update(s) had a non-finite gradient"), last
    assert "Traceback" not in out.stderr
