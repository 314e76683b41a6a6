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
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

TASKS = ("toolcall", "math", "code")  # the paper's task modules (get_task)

TaskLoader = Callable[[Any], "TaskData"]
_TASKS: dict[str, TaskLoader] = {}


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


def register_task(name: str) -> Callable[[TaskLoader], TaskLoader]:
    """Decorator registering a loader `cfg -> TaskData` under `config.task.name` = name."""

    def deco(fn: TaskLoader) -> TaskLoader:
        _TASKS[name] = fn
        return fn

    return deco


def get_task(name: str) -> ModuleType:
    """The paper task module `gdpo_jax.tasks.<name>` (imports register its rewards)."""
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return importlib.import_module(f"gdpo_jax.tasks.{name}")
