"""Reward registry and RewardRunner: gating, errors, timeouts, process pool."""

import math
import sys
import time

import numpy as np
import pytest

from gdpo_jax.rewards import (
    RewardError,
    RewardRunner,
    RewardSpec,
    estimate_tokens,
    get_reward,
    list_rewards,
    register_reward,
)


@register_reward("_test_value")
def _value(prompts, completions, *, value, scale=1.0, **kw):
    return [float(v) * scale for v in value]


@register_reward("_test_boom")
def _boom(prompts, completions, **kw):
    out = []
    for c in completions:
        if "boom" in c:
            raise ZeroDivisionError("exploded on purpose")
        out.append(1.0)
    return out


@register_reward("_test_sleepy")
def _sleepy(prompts, completions, **kw):
    if any("sleep" in c for c in completions):
        time.sleep(2.0)
    return [1.0] * len(completions)


@register_reward("_test_wrong_len")
def _wrong_len(prompts, completions, **kw):
    return [1.0] * (len(completions) + 1)


@register_reward("_test_cpu")
def _cpu(prompts, completions, **kw):  # module level: picklable for the process pool
    return [float(sum(i * i for i in range(1000)) % 7 + len(c)) for c in completions]


@register_reward("_test_hang")
def _hang(prompts, completions, **kw):  # module level: picklable for the process pool
    out = []
    for c in completions:
        if c == "hang":
            time.sleep(60)
        out.append(1.0)
    return out


def _batch(values, completions=None):
    n = len(values)
    completions = completions or [f"c{i}" for i in range(n)]
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(n)]
    examples = [{"prompt": p, "value": v} for p, v in zip(prompts, values)]
    return prompts, completions, examples


def test_registry_lists_builtins_and_rejects_unknown():
    names = list_rewards()
    for n in (
        "toolcall_format",
        "toolcall_correctness",
        "math_correct",
        "length",
        "code_pass_rate",
        "code_bug",
    ):
        assert n in names
    with pytest.raises(KeyError, match="known rewards: .*math_correct"):
        get_reward("no_such_reward")


def test_every_task_reward_is_found_on_the_first_lookup_in_a_fresh_process():
    # The toy, three_binary and format_cold_toy rewards used to register only when
    # the task registry loaded: get_reward("toy_correct") in a fresh process (a
    # notebook) raised KeyError. Reference: the names registered in the sources.
    import json
    import os
    import pathlib
    import re
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    want = {
        m
        for p in (root / "gdpo_jax" / "tasks").glob("*.py")
        for m in re.findall(r'register_reward\(\s*"(\w+)"', p.read_text())
    }
    assert {"toy_correct", "three_marker", "toy_correct_pm3", "math_correct"} <= want
    code = (
        "import json; from gdpo_jax.rewards import get_reward, list_rewards\n"
        "get_reward('toy_correct'); print(json.dumps(list_rewards()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert want <= set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_register_clash_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        register_reward("_test_value")(lambda p, c, **k: [0.0] * len(c))
    register_reward("_test_value")(_value)  # same function again: fine


@pytest.mark.parametrize("name", ["total", "ns/a", "a/mean"])
def test_a_reward_name_that_clashes_with_the_metric_names_is_refused(name):
    # "reward/total/mean" and the weighted "reward/total" (and ns/a, ns/b) shared one
    # plot file and one summary entry: the last written hid the other.
    with pytest.raises(ValueError, match=r"clashes with the metric names .* e\.g\. '"):
        register_reward(name)(_value)


def test_values_kwargs_and_extra_fields():
    prompts, comps, ex = _batch([1, 2, 3])
    with RewardRunner(
        [RewardSpec("_test_value", kwargs={"scale": 2.0}), "length"], num_workers=2
    ) as r:
        R, info = r(prompts, comps, ex, completion_lengths=np.array([1, 5000, 3]))
    np.testing.assert_array_equal(R, np.array([[2, 1], [4, 0], [6, 1]], np.float32))
    assert R.dtype == np.float32
    assert info["reward_failures/_test_value"] == 0 and info["reward_time/total"] > 0
    np.testing.assert_array_equal(r.weights, [1.0, 1.0])


def test_gating_numpy_semantics_and_chain():
    # value column: [cond]; a gated on cond >= 1; b gated on a >= 0.5.
    @register_reward("_test_const", overwrite=True)
    def const(prompts, completions, *, c, **kw):
        return list(c)

    cond = [1.0, 0.0, math.nan, 2.0]
    prompts, comps, _ = _batch(cond)
    ex = [{"value": v, "c": 0.7} for v in cond]
    specs = [
        RewardSpec("_test_const", condition="_test_value", threshold=1.0),
        RewardSpec("_test_value"),
        RewardSpec("length", condition="_test_const", threshold=0.5, kwargs={"max_tokens": 100}),
    ]
    with RewardRunner(specs) as r:
        R, _ = r(prompts, comps, ex)
    # hand-worked: const kept where cond >= 1 (rows 0, 3), 0 where cond < 1,
    # NaN where cond is NaN (undecidable gate); the chain follows the gated value.
    np.testing.assert_allclose(R[:, 0], [0.7, 0.0, np.nan, 0.7], rtol=1e-6)
    np.testing.assert_allclose(R[:, 2], [1.0, 0.0, np.nan, 1.0])
    assert np.isnan(R[2, 1])


def test_gating_matches_core_gate_reward():
    from gdpo_jax.core import gate_reward as gate

    cond = np.array([1.0, 0.0, np.nan, 2.0, 0.99], np.float32)
    rew = np.array([0.5, 0.5, 0.5, np.nan, 0.5], np.float32)
    prompts, comps, _ = _batch(list(cond))
    ex = [{"value": c, "rv": r_} for c, r_ in zip(cond, rew)]

    @register_reward("_test_rv", overwrite=True)
    def rv(prompts, completions, *, rv, **kw):
        return list(rv)

    with RewardRunner(
        [RewardSpec("_test_value"), RewardSpec("_test_rv", condition="_test_value")]
    ) as r:
        R, _ = r(prompts, comps, ex)
    np.testing.assert_array_equal(R[:, 1], np.asarray(gate(rew, cond, 1.0)))


def test_raise_names_function_and_sample():
    prompts, comps, ex = _batch([0, 0, 0, 0], ["fine", "ok", "boom goes here", "fine"])
    with RewardRunner(["_test_boom"], num_workers=2, on_error="raise") as r:
        with pytest.raises(RewardError) as ei:
            r(prompts, comps, ex)
    msg = str(ei.value)
    assert "_test_boom" in msg and "test_rewards._boom" in msg
    assert "sample 2" in msg and "boom goes here" in msg and "question 2" in msg
    assert "ZeroDivisionError: exploded on purpose" in msg
    assert ei.value.index == 2 and isinstance(ei.value.__cause__, ZeroDivisionError)


def test_nan_mode_counts_failures():
    prompts, comps, ex = _batch([0] * 5, ["a", "boom", "b", "boom", "c"])
    with RewardRunner(["_test_boom", "_test_value"], num_workers=2, on_error="nan") as r:
        R, info = r(prompts, comps, ex)
    assert np.isnan(R[[1, 3], 0]).all() and (R[[0, 2, 4], 0] == 1.0).all()
    assert info["reward_failures/_test_boom"] == 2 and info["reward_nan/_test_boom"] == 2
    assert info["reward_failures/_test_value"] == 0


def test_wrong_length_output_is_reported():
    prompts, comps, ex = _batch([0, 0])
    with RewardRunner(["_test_wrong_len"]) as r:
        with pytest.raises(RewardError, match="returned 2 values for 1 completions"):
            r(prompts, comps, ex)


def test_timeout_raise_and_nan():
    prompts, comps, ex = _batch([0] * 4, ["a", "sleep", "b", "c"])
    with RewardRunner(
        ["_test_sleepy", "_test_value"], num_workers=4, timeout_s=0.3, chunk_size=2, on_error="nan"
    ) as r:
        t0 = time.perf_counter()
        R, info = r(prompts, comps, ex)
        assert time.perf_counter() - t0 < 1.8  # did not wait for the 2 s sleep
        assert np.isnan(R[:2, 0]).all() and (R[2:, 0] == 1).all()
        assert info["reward_timeouts/_test_sleepy"] == 2
        R2, _ = r(prompts[2:], comps[2:], ex[2:])  # a fresh pool serves the next call
        assert (R2[:, 0] == 1).all()
    with RewardRunner(["_test_sleepy"], timeout_s=0.3, on_error="raise") as r:
        with pytest.raises(RewardError, match="timed out after 0.3s"):
            r(prompts, comps, ex)


def test_process_executor_same_values():
    prompts, comps, ex = _batch([0] * 6, ["x" * i for i in range(6)])
    with RewardRunner(["_test_cpu"], num_workers=2) as r:
        want, _ = r(prompts, comps, ex)
    with RewardRunner([RewardSpec("_test_cpu", executor="process")], num_workers=2) as r:
        got, info = r(prompts, comps, ex)
    np.testing.assert_array_equal(got, want)
    assert want[3, 0] == float(sum(i * i for i in range(1000)) % 7 + 3)


def test_process_executor_rejects_unpicklable():
    register_reward("_test_lambda", overwrite=True)(lambda p, c, **k: [0.0] * len(c))
    with pytest.raises(ValueError, match="does not pickle"):
        RewardRunner([RewardSpec("_test_lambda", executor="process")])


@pytest.mark.parametrize(
    "specs, err",
    [
        ([RewardSpec("length", condition="nope")], "not one of this runner's rewards"),
        (
            [
                RewardSpec("length", condition="_test_value"),
                RewardSpec("_test_value", condition="length"),
            ],
            "cycle",
        ),
        (["length", "length"], "unique"),
        ([RewardSpec("length", executor="gpu")], "executor"),
        ([{"name": "length", "wieght": 2}], "unknown keys"),
    ],
)
def test_bad_specs(specs, err):
    with pytest.raises(ValueError, match=err):
        RewardRunner(specs)


def test_spec_parse_and_batch_checks():
    s = RewardSpec.parse(
        {"name": "length", "weight": 0.5, "condition": None, "kwargs": {"max_tokens": 3}}
    )
    assert s == RewardSpec("length", 0.5, None, 1.0, {"max_tokens": 3})
    assert RewardSpec.parse("length") == RewardSpec("length")
    prompts, comps, ex = _batch([1, 2])
    with RewardRunner(["_test_value"]) as r:
        with pytest.raises(ValueError, match="one entry per completion"):
            r(prompts, comps[:1], ex)
        with pytest.raises(ValueError, match="extra field 'completion_lengths' has 3 entries"):
            r(prompts, comps, ex, completion_lengths=[1, 2, 3])


def test_length_estimate():
    assert estimate_tokens("a b c") == 3  # words beat chars/4 = 2
    assert estimate_tokens("x" * 41) == 11  # ceil(41 / 4)
    f = get_reward("length")
    assert f(None, ["a b c", "x" * 41], max_tokens=10) == [1.0, 0.0]
    assert f(None, ["a", "b"], max_tokens=10, completion_lengths=[10, 11]) == [1.0, 0.0]


def test_all_workers_hung_moves_the_queue_to_a_fresh_pool():
    # The chunks queued behind a hung one were cancelled and scored NaN as "timed out"
    # though they never ran; they now run in a fresh pool.
    prompts, comps, ex = _batch([0, 0, 0], ["sleep", "a", "b"])
    with RewardRunner(
        ["_test_sleepy"], num_workers=1, chunk_size=1, timeout_s=0.3, on_error="nan"
    ) as r:
        t0 = time.perf_counter()
        R, info = r(prompts, comps, ex)
        assert time.perf_counter() - t0 < 1.8
    np.testing.assert_array_equal(R[:, 0], [np.nan, 1.0, 1.0])
    assert info["reward_timeouts/_test_sleepy"] == 1


def test_a_hung_reward_does_not_score_the_rewards_after_it_nan():
    # Every chunk of the first reward hangs and holds both workers: the second reward's
    # chunks, queued behind them, were scored NaN, counted as its failures and timeouts,
    # and charged timeout_s each, though it never ran.
    prompts, comps, ex = _batch([3, 4, 5, 6], ["sleep"] * 4)
    with RewardRunner(
        ["_test_sleepy", "_test_value"], num_workers=2, chunk_size=1, timeout_s=0.3, on_error="nan"
    ) as r:
        t0 = time.perf_counter()
        R, info = r(prompts, comps, ex)
        assert time.perf_counter() - t0 < 1.9  # two rounds of hung chunks, then the rest
    assert np.isnan(R[:, 0]).all() and info["reward_timeouts/_test_sleepy"] == 4
    np.testing.assert_array_equal(R[:, 1], [3, 4, 5, 6])
    assert info["reward_failures/_test_value"] == info["reward_timeouts/_test_value"] == 0
    assert info["reward_time/_test_value"] < 0.3


@register_reward("_test_exits")
def _exits(prompts, completions, **kw):  # module level: picklable for the process pool
    if any(c == "exit" for c in completions):
        sys.exit(0)
    return [1.0] * len(completions)


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_a_reward_calling_sys_exit_is_a_failure_not_the_end_of_the_run(executor):
    # SystemExit passed `except Exception`: in a thread it left the runner (sys.exit(0)
    # ended training with status 0); in a worker process it killed the worker (a timeout).
    prompts, comps, ex = _batch([0] * 3, ["a", "exit", "b"])
    spec = RewardSpec("_test_exits", executor=executor)
    with RewardRunner([spec], num_workers=1, timeout_s=20, on_error="nan") as r:
        R, info = r(prompts, comps, ex)
    np.testing.assert_array_equal(R[:, 0], [1.0, np.nan, 1.0])
    assert info["reward_failures/_test_exits"] == 1 and info["reward_timeouts/_test_exits"] == 0


def test_a_process_pools_start_up_is_not_part_of_a_jobs_timeout():
    # The pool's start-up (its imports take 2.5 s here) ran on the first jobs' clocks: at
    # timeout_s=1.5 every call timed out, each one's fresh pool paying the start-up again.
    spec = RewardSpec("_test_cpu", executor="process")
    prompts, comps, ex = _batch([0] * 2)
    with RewardRunner(
        [spec], num_workers=1, timeout_s=1.5, imports=("tests._slow_import",), on_error="nan"
    ) as r:
        R, info = r(prompts, comps, ex)
    assert np.isfinite(R).all() and info["reward_timeouts/_test_cpu"] == 0


def test_an_import_path_reward_whose_module_fails_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "gdpo_broken_reward_mod.py").write_text("undefined_name + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ImportError, match=r"importing module 'gdpo_broken_reward_mod' failed \(NameError"
    ):
        get_reward("gdpo_broken_reward_mod:r")


def _ghost_reward():
    """A reward whose module exists only in this process (as one defined in a
    config file does): worker processes cannot import it."""
    import sys
    import types

    mod = types.ModuleType("_gdpo_ghost_rewards")
    exec(
        "def ghost(prompts, completions, **kw):\n    return [1.0] * len(completions)\n",
        mod.__dict__,
    )
    sys.modules[mod.__name__] = mod
    return register_reward("_test_ghost", overwrite=True)(mod.ghost)


def test_process_worker_import_error_is_reported_as_such():
    # Issue #13 item 14: was "timed out after 30.0s" (the pool lost the task).
    _ghost_reward()
    prompts, comps, ex = _batch([0] * 2)
    spec = RewardSpec("_test_ghost", executor="process")
    with RewardRunner([spec], num_workers=1, timeout_s=20) as r:
        t0 = time.perf_counter()
        with pytest.raises(RewardError, match="ModuleNotFoundError.*could not unpickle") as e:
            r(prompts, comps, ex)
        assert "timed out" not in str(e.value) and "config.imports" in str(e.value)
        assert time.perf_counter() - t0 < 15
    with RewardRunner([spec], num_workers=1, timeout_s=20, on_error="nan") as r:
        R, info = r(prompts, comps, ex)
    assert np.isnan(R).all() and info["reward_failures/_test_ghost"] == 2
    assert info["reward_timeouts/_test_ghost"] == 0


def test_process_worker_imports_failure_is_reported():
    spec = RewardSpec("_test_cpu", executor="process")
    with RewardRunner([spec], num_workers=1, imports=("no_such_module_for_gdpo",)) as r:
        with pytest.raises(RewardError, match="importing 'no_such_module_for_gdpo'.*worker"):
            r(*_batch([0]))


@register_reward("_test_self_bounded")
def _self_bounded(prompts, completions, **kw):  # module level: picklable
    from gdpo_jax.rewards import RewardTimeouts

    vals = [math.nan if "slow" in c else 1.0 for c in completions]
    bad = [i for i, c in enumerate(completions) if "slow" in c]
    if bad:
        raise RewardTimeouts(vals, bad)
    return vals


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_reward_timeouts_are_counted_not_failures(executor):
    prompts, comps, ex = _batch([0] * 4, ["a", "slow", "b", "slow"])
    spec = RewardSpec("_test_self_bounded", executor=executor)
    with RewardRunner([spec], num_workers=2, on_error="raise") as r:
        R, info = r(prompts, comps, ex)
    np.testing.assert_array_equal(np.isnan(R[:, 0]), [False, True, False, True])
    assert info["reward_timeouts/_test_self_bounded"] == 2
    assert info["reward_failures/_test_self_bounded"] == 0


def test_reward_by_import_path(tmp_path, monkeypatch):
    # Issue #14 item 3: "pkg.mod:fn" (or "pkg.mod.fn") needs no registration.
    (tmp_path / "gdpo_my_rewards.py").write_text(
        "def no_filler(prompts, completions, **kw):\n"
        "    return [0.0 if 'um' in c.split() else 1.0 for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("gdpo_my_rewards:no_filler", "gdpo_my_rewards.no_filler"):
        with RewardRunner([name]) as r:
            R, _ = r(*_batch([0, 0], ["um yes", "yes"]))
        np.testing.assert_array_equal(R[:, 0], [0.0, 1.0])
    with pytest.raises(ImportError, match="cannot import module 'gdpo_no_such_mod'"):
        get_reward("gdpo_no_such_mod:fn")
    with pytest.raises(KeyError, match="has no callable 'nope'"):
        get_reward("gdpo_my_rewards:nope")


def test_failed_builtin_import_names_its_cause_and_is_retried(monkeypatch):
    # Issue #13 item 13: was marked loaded before importing, then "unknown reward" forever.
    import sys

    from gdpo_jax.rewards import registry

    monkeypatch.setattr(registry, "_builtins_loaded", set())
    monkeypatch.setattr(registry, "_BUILTIN_MODULES", ("gdpo_jax.rewards._no_such_builtin",))
    for _ in range(2):
        with pytest.raises(ImportError, match="_no_such_builtin failed: ModuleNotFoundError"):
            get_reward("some_unregistered_reward")
    # The retry imports a module not imported yet (a stdlib one nothing here uses).
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    monkeypatch.setattr(registry, "_BUILTIN_MODULES", ("colorsys",))
    # (_test_value: registered by this file; "length" now registers from gdpo_jax.tasks.length)
    assert "_test_value" in list_rewards() and "colorsys" in registry._builtins_loaded
    assert "colorsys" in sys.modules


def test_a_hung_process_job_does_not_time_out_the_jobs_after_it():
    """One worker, a job that hangs, two that do not: only the hung one times out. The
    timed-out job kept its worker busy, the next jobs queued behind it with their
    deadlines running, and all three timed out; now its pool is retired at once and
    the next jobs run in a fresh one (the retired pool is terminated)."""
    prompts, comps, ex = _batch([0] * 3, ["hang", "fast", "fast"])
    spec = RewardSpec("_test_hang", executor="process")
    # 6 s: a fresh pool's start-up counted against a job's deadline (no longer: see
    # test_a_process_pools_start_up_is_not_part_of_a_jobs_timeout), and on a loaded
    # 2-core machine it took more than 3 s (every job timed out).
    timeout = 6.0
    with RewardRunner([spec], num_workers=1, timeout_s=timeout, on_error="nan", chunk_size=1) as r:
        t0 = time.perf_counter()
        R, info = r(prompts, comps, ex)
        wall = time.perf_counter() - t0
        np.testing.assert_array_equal(R[:, 0], [np.nan, 1.0, 1.0])
        assert info["reward_timeouts/_test_hang"] == 1
        assert wall < 3 * timeout, wall  # not each job waiting out the hung one
        assert r._retired == []  # terminated when the call ended


@register_reward("_test_time_left")
def _time_left(prompts, completions, **kw):  # module level: picklable
    """Seconds left to the runner's deadline (NaN when none was given)."""
    deadline = kw.get("deadline")
    return [math.nan if deadline is None else deadline - time.monotonic()] * len(completions)


_time_left.accepts_deadline = True


@register_reward("_test_no_deadline")
def _no_deadline(prompts, completions, **kw):
    return [float("deadline" in kw)] * len(completions)


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_runner_passes_its_deadline_to_rewards_that_accept_it(executor):
    # So that a reward bounding its own work (the code rewards' sandbox) ends before the
    # runner gives up on it (timeout_s): a margin of 10% of it (at most 1 s) is kept for
    # returning the values. Other rewards get no such keyword; a config cannot set it.
    from gdpo_jax.rewards.registry import reward_options

    specs = [
        RewardSpec("_test_time_left", executor=executor),
        RewardSpec("_test_no_deadline", executor=executor),
    ]
    with RewardRunner(specs, num_workers=2, timeout_s=20) as r:
        R, _ = r(*_batch([0, 0]))
    # The clock starts with the task (a process pool's start-up counts too).
    low = 18 if executor == "thread" else 0
    assert low < R[:, 0].min() and R[:, 0].max() <= 19 and R[:, 1].tolist() == [0, 0]
    assert "deadline" not in reward_options("code_pass_rate")


_GROUP_SIGNAL_CHILD = """
import signal, sys, time
import numpy as np
from tests.test_rewards import _batch  # registers _test_cpu
from gdpo_jax.rewards import RewardRunner, RewardSpec
noticed = []
signal.signal(signal.SIGTERM, lambda s, f: noticed.append(s))  # as the trainer's watch
spec = RewardSpec("_test_cpu", executor="process")
with RewardRunner([spec], num_workers=2, timeout_s=20, on_error="raise") as r:
    p, c, e = _batch([0] * 4, ["x" * i for i in range(4)])
    want, _ = r(p, c, e)
    print("ready", flush=True)
    while not noticed:
        time.sleep(0.05)
    time.sleep(0.5)  # the signal reached the rest of the group by now
    got, _ = r(p, c, e)
    print("scored", bool((got == want).all()), flush=True)
"""


def test_a_signal_to_the_process_group_leaves_the_reward_workers_running(tmp_path):
    # SLURM (or `kill -TERM -<pgid>`) signals the trainer's whole process group on a
    # preemption. The pool's workers were in it: killed busy, their calls scored NaN or
    # timed out; killed idle, one left the task queue locked and the next call and the
    # pool's terminate waited for ever, so the trainer never saved its step.
    import os
    import signal
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen(
        [sys.executable, "-c", _GROUP_SIGNAL_CHILD],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as a job's
    )
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and out.strip() == "scored True", err[-2000:]
