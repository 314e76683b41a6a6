"""The one task registry: what `config.task.name` names, and the paper task modules.

Two views of the same tasks:
  - trainer tasks: `register_task(name)` on a loader `cfg -> TaskData`; the trainer
    calls `load_task(cfg)`. Built in: toolcall / math / code (gdpo_jax.tasks.sources),
    toy_toolcall (gdpo_jax.tasks.toy) and three_binary (gdpo_jax.tasks.three_binary);
    a config, notebook or test adds its own:

        @register_task("my_task")
        def load(cfg) -> TaskData: ...

  - paper task modules: `get_task(name)` -> the module gdpo_jax.tasks.<name> with
    `load(path, split=...)`, `default_rewards()` and `evaluate(...)`.

The built-in trainer tasks register when their modules are imported, on the first
`list_tasks` / `load_task` (by gdpo_jax.tasks, which imports them; this module imports
none of them, so they can import it without a cycle).

A task registered with `kwargs=` (a table of `Kwarg`s, maybe a `SumAtMost`) has its
`config.task.kwargs` checked by `load_task` before any record is made: an unknown key,
a wrong type or a value out of range is one ConfigError naming
`config.task.kwargs.<key>` and a value that works (it was a TypeError,
ZeroDivisionError or "sample larger than population" from inside the generator, or a
value silently clipped). A task registered without a table is left to its loader.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import numbers
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from gdpo_jax.errors import ConfigError

TASKS = ("toolcall", "math", "code")  # the paper's task modules (get_task)

TaskLoader = Callable[[Any], "TaskData"]
_TASKS: dict[str, TaskLoader] = {}
_KWARGS: dict[str, tuple] = {}  # task name -> its kwargs table (absent: not declared)
SYNTHETIC_ONLY: set[str] = set()  # tasks whose loader reads no file (register_task)


@dataclasses.dataclass(frozen=True)
class Kwarg:
    """One `config.task.kwargs` key a task takes.

    kind: int, float or str (a bool is neither an int nor a number here, and a float
    is not an int: 4.0 tools is a typo, not a count); low / high: inclusive bounds
    (None: none); choices: the allowed strings; default: the generator's default,
    suggested as the fix; means: what it sets, said in the error.
    """

    name: str
    kind: type
    default: Any
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    means: str = ""

    def holds(self, value: Any) -> bool:
        if self.kind is str:
            return isinstance(value, str) and (not self.choices or value in self.choices)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.kind is int and not isinstance(value, numbers.Integral):
            return False
        # NaN fails every bound; infinity is no count or probability either.
        return (
            math.isfinite(value)
            and (self.low is None or value >= self.low)
            and (self.high is None or value <= self.high)
        )

    def describe(self) -> str:
        if self.choices:
            where = f"one of {list(self.choices)}"
        else:
            where = "an int" if self.kind is int else "a number"
            if self.low is not None and self.high is not None:
                where += f" in [{_num(self.low)}, {_num(self.high)}]"
            elif self.low is not None:
                where += f" >= {_num(self.low)}"
            elif self.high is not None:
                where += f" <= {_num(self.high)}"
        return where + (f" ({self.means})" if self.means else "")


@dataclasses.dataclass(frozen=True)
class SumAtMost:
    """The kwargs `names` (their defaults where unset) must sum to at most `limit`:
    probabilities of exclusive cases, which the generator would otherwise quietly cap."""

    names: tuple[str, ...]
    limit: float
    means: str = ""


TaskKwargs = tuple["Kwarg | SumAtMost", ...]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def check_kwargs(task: str, kwargs: Mapping[str, Any], table: TaskKwargs) -> None:
    """Raises one-line ConfigError for the first bad key of `kwargs` (config.task.kwargs
    of task `task`) against its table: unknown key, then type / range, then sums."""
    fields = {k.name: k for k in table if isinstance(k, Kwarg)}
    unknown = sorted(set(kwargs) - set(fields))
    if unknown:
        raise ConfigError(
            f"config.task.kwargs: task {task!r} takes no keyword argument(s) {unknown}; "
            f"valid keys: {sorted(fields)}. Remove the key or fix its spelling."
        )
    for k in fields.values():
        if k.name in kwargs and not k.holds(kwargs[k.name]):
            raise ConfigError(
                f"config.task.kwargs.{k.name}={kwargs[k.name]!r}: task {task!r} needs "
                f"{k.describe()}; e.g. --config.task.kwargs.{k.name}={k.default}."
            )
    for s in table:
        if isinstance(s, SumAtMost):
            total = sum(kwargs.get(n, fields[n].default) for n in s.names)
            if total > s.limit + 1e-12:  # 0.9 + 0.1 is a sum of 1
                named = " + ".join(f"config.task.kwargs.{n}" for n in s.names)
                raise ConfigError(
                    f"{named} = {total:g}: task {task!r} needs a sum <= "
                    f"{_num(s.limit)}" + (f" ({s.means})" if s.means else "") + "; lower one."
                )


def task_kwargs(name: str) -> TaskKwargs | None:
    """The kwargs table task `name` was registered with (None: not declared)."""
    return _KWARGS.get(name)


@dataclasses.dataclass
class TaskData:
    """train / eval: records (dicts with "prompt" + reward fields).

    evaluate: optional task metric fn(completions, examples, **kw) -> dict of
      floats (the gdpo_jax.tasks convention), called on held-out completions
      (one entry per completion; examples repeated for k samples per prompt;
      kw: completion_lengths, group_ids and config.task.eval_kwargs).
    """

    train: list[dict]
    eval: list[dict]
    evaluate: Callable[..., dict] | None = None


def register_task(
    name: str, *, kwargs: TaskKwargs | None = None, synthetic_only: bool = False
) -> Callable[[TaskLoader], TaskLoader]:
    """Decorator registering a loader `cfg -> TaskData` under `config.task.name` = name.

    kwargs: the table of `config.task.kwargs` the loader takes (`()`: none), checked
    by `load_task` before the loader runs; None leaves them to the loader.
    synthetic_only: the loader generates its records and reads no file: a
      `config.task.source` or `eval_source` naming one is refused (it was ignored).
    """

    def deco(fn: TaskLoader) -> TaskLoader:
        _TASKS[name] = fn
        if kwargs is None:
            _KWARGS.pop(name, None)  # a re-registration drops the old table
        else:
            _KWARGS[name] = tuple(kwargs)
        if synthetic_only:
            SYNTHETIC_ONLY.add(name)
        else:
            SYNTHETIC_ONLY.discard(name)
        return fn

    return deco


def get_task(name: str) -> ModuleType:
    """The paper task module `gdpo_jax.tasks.<name>` (imports register its rewards)."""
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return importlib.import_module(f"gdpo_jax.tasks.{name}")
