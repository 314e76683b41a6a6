"""config.task.kwargs are checked against each task's table before any record is made.

A bad value used to fail inside the generator (toy num_tools=0: ZeroDivisionError;
toolcall n_tools=9: "sample larger than population"; math max_steps=0: randint's
"empty range") or to do something else quietly (toy num_tools=9 meant 8; a bool was
an int). Each case here is one ConfigError line naming `config.task.kwargs.<key>`.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import sys

import ml_collections as mlc
import pytest

from gdpo_jax import tasks
from gdpo_jax.data import synthetic
from gdpo_jax.errors import ConfigError
from gdpo_jax.tasks import registry, toy
from gdpo_jax.train.config import base_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ("toy_toolcall", "three_binary", "toolcall", "math", "code")


def _cfg(name: str, **kwargs):
    c = base_config()
    c.task.name, c.task.source, c.task.num_train, c.task.num_eval = name, "synthetic", 4, 2
    c.task.kwargs = mlc.ConfigDict(kwargs)
    return c


# (task, kwargs, what the one-line message must contain)
BAD = [
    ("toy_toolcall", {"num_tools": 0}, "config.task.kwargs.num_tools=0: "),
    ("toy_toolcall", {"num_tools": -1}, "config.task.kwargs.num_tools=-1: "),
    ("toy_toolcall", {"num_tools": 9}, "config.task.kwargs.num_tools=9: "),
    ("toy_toolcall", {"num_tools": True}, "config.task.kwargs.num_tools=True: "),
    ("toy_toolcall", {"num_tools": "4"}, "config.task.kwargs.num_tools='4': "),
    ("toy_toolcall", {"num_tools": 4.0}, "config.task.kwargs.num_tools=4.0: "),
    ("toy_toolcall", {"num_args": 1}, "config.task.kwargs.num_args=1: "),
    ("toy_toolcall", {"num_args": 25}, "config.task.kwargs.num_args=25: "),
    ("toy_toolcall", {"filler": -0.1}, "config.task.kwargs.filler=-0.1: "),
    ("toy_toolcall", {"filler": 1.5}, "config.task.kwargs.filler=1.5: "),
    ("toy_toolcall", {"filler": math.nan}, "config.task.kwargs.filler=nan: "),
    ("toy_toolcall", {"filler": "0.5"}, "config.task.kwargs.filler='0.5': "),
    ("toy_toolcall", {"num_tool": 4}, "config.task.kwargs: task 'toy_toolcall' takes no"),
    ("three_binary", {"num_args": 0}, "config.task.kwargs.num_args=0: "),
    ("three_binary", {"filler": True}, "config.task.kwargs.filler=True: "),
    ("toolcall", {"n_tools": 0}, "config.task.kwargs.n_tools=0: "),
    ("toolcall", {"n_tools": 9}, "config.task.kwargs.n_tools=9: "),
    ("toolcall", {"n_tools": "2"}, "config.task.kwargs.n_tools='2': "),
    ("toolcall", {"p_multi": 1.5}, "config.task.kwargs.p_multi=1.5: "),
    ("toolcall", {"p_none": -0.1}, "config.task.kwargs.p_none=-0.1: "),
    ("toolcall", {"p_none": 0.6, "p_multi": 0.5}, "kwargs.p_multi + config.task.kwargs.p_none"),
    ("toolcall", {"seed": 1}, "config.task.kwargs: task 'toolcall' takes no keyword"),
    ("math", {"max_steps": 0}, "config.task.kwargs.max_steps=0: "),
    ("math", {"max_steps": False}, "config.task.kwargs.max_steps=False: "),
    ("math", {"max_value": 1}, "config.task.kwargs.max_value=1: "),
    ("math", {"max_tokens": 0}, "config.task.kwargs.max_tokens=0: "),
    ("math", {"fmt": "json"}, "config.task.kwargs.fmt='json': "),
    ("code", {"n_tools": 2}, "config.task.kwargs: task 'code' takes no keyword"),
]


@pytest.mark.parametrize("name,kwargs,want", BAD, ids=[f"{t}-{k}" for t, k, _ in BAD])
def test_bad_task_kwarg_is_one_line_naming_the_field(name, kwargs, want, monkeypatch):
    tasks.list_tasks()  # register the built-ins, then make their loaders fail loudly

    def loader(cfg):
        raise AssertionError("the task loader ran before its kwargs were checked")

    monkeypatch.setitem(registry._TASKS, name, loader)
    with pytest.raises(ConfigError) as e:
        tasks.load_task(_cfg(name, **kwargs))
    msg = str(e.value)
    assert want in msg and "\n" not in msg, msg
    assert "--config.task.kwargs." in msg or "Remove the key" in msg or "lower one" in msg


def _generator_options(name: str) -> dict:
    """The keyword options (and defaults) of the function that makes `name`'s records."""
    fn = {
        "toy_toolcall": toy.records,
        "three_binary": toy.records,
        "toolcall": synthetic.toolcall_records,
        "math": synthetic.arithmetic_records,
    }.get(name)
    if fn is None:  # code: no synthetic source, no options
        return {}
    params = inspect.signature(fn).parameters.values()
    skip = {"n", "seed", "split", "exclude", "distinct"}  # set by the loader (make_splits)
    return {p.name: p.default for p in params if p.name not in skip}


@pytest.mark.parametrize("name", CHECKED)
def test_tables_match_the_generators_and_their_defaults_load(name):
    table = tasks.task_kwargs(name)
    assert table is not None
    defaults = {k.name: k.default for k in table if isinstance(k, tasks.Kwarg)}
    assert defaults == _generator_options(name)
    if name != "code":  # every default, set explicitly, passes and makes records
        assert len(tasks.load_task(_cfg(name, **defaults)).train) == 4


@pytest.mark.parametrize(
    "name,kwargs",
    [  # the bounds themselves are valid: the generators work there
        ("toy_toolcall", {"num_tools": 1, "num_args": 2, "filler": 0.0}),
        ("toy_toolcall", {"num_tools": 8, "num_args": 24, "filler": 1}),
        ("toolcall", {"n_tools": 1, "p_multi": 0.0, "p_none": 0.0}),
        ("toolcall", {"n_tools": len(synthetic.CATALOGUE), "p_multi": 0.9, "p_none": 0.1}),
        ("math", {"max_steps": 1, "max_value": 2, "max_tokens": 1, "fmt": "deepscaler"}),
    ],
)
def test_bounds_load(name, kwargs):
    assert len(tasks.load_task(_cfg(name, **kwargs)).train) == 4


def _configs():
    sys.path.insert(0, ROOT)
    names = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py"))
    for mod in names:
        get = getattr(importlib.import_module(f"configs.{mod}"), "get_config", None)
        if get is None:  # __init__, paper_common: helpers
            continue
        for arg in ("", "runlocal", "quick"):
            try:
                yield f"{mod}:{arg}", get(arg)
            except ValueError:  # an option this config does not have
                assert arg, f"configs/{mod}.py get_config('') failed"


def test_config_files_task_kwargs_pass():
    seen = 0
    for where, c in _configs():
        table = tasks.task_kwargs(c.task.name)
        assert table is not None or not c.task.kwargs.to_dict(), where
        registry.check_kwargs(c.task.name, c.task.kwargs.to_dict(), table or ())
        seen += bool(c.task.kwargs.to_dict())
    assert seen >= 2  # tiny_cpu and smollm2_toolcall set some


def test_a_config_files_own_task_declares_its_kwargs():
    # toolcall_oneshot (configs/smollm2_toolcall.py) loads "toolcall" with the same
    # kwargs; registered without a table, a bad value met validate_config unchecked.
    from gdpo_jax.train.config import validate_config

    c = dict(_configs())["smollm2_toolcall:"]
    c.workdir = "/tmp/unused"
    assert tasks.task_kwargs("toolcall_oneshot") == tasks.task_kwargs("toolcall")
    c.task.kwargs.n_tools = 0
    with pytest.raises(
        ConfigError, match=r"config\.task\.kwargs\.n_tools=0: task 'toolcall_oneshot'"
    ):
        validate_config(c)


def test_the_length_rewards_limit_is_the_exceed_ratios():
    """rewards.kwargs.length.max_tokens and task.eval_kwargs.max_tokens were set apart:
    one overridden, the logged `length` column and eval/exceed_ratio measured two
    limits. Set apart they are refused; the reward's alone reaches the eval too."""
    import sys

    from gdpo_jax.train.config import ConfigError, task_eval_kwargs, validate_config

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from configs.replica_math import get_config

    cfg = get_config("quick")
    cfg.workdir = "/tmp/unused"
    validate_config(cfg)
    assert task_eval_kwargs(cfg)["max_tokens"] == cfg.rewards.kwargs.length.max_tokens
    cfg.rewards.kwargs.length.max_tokens += 5
    with pytest.raises(ConfigError, match=r"length\.max_tokens=\d+ and .*eval_kwargs\.max_tokens"):
        validate_config(cfg)
    del cfg.task.eval_kwargs["max_tokens"]  # the reward's limit alone: the eval's too
    validate_config(cfg)
    assert task_eval_kwargs(cfg)["max_tokens"] == cfg.rewards.kwargs.length.max_tokens
