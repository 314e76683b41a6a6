"""Tasks: the one registry the trainer asks (`config.task.name`), and the task modules.

The paper's three tasks (toolcall, math, code) are modules providing
`load(path, split=...)` (records with at least "prompt" as chat messages and its
reward fields), `default_rewards()` (RewardSpecs) and `evaluate(completions,
examples, ...)`; `sources` turns them into trainer tasks (config.task.source /
eval_source / "synthetic"); `toy` is the word-level task of the tiny CPU config;
`length` the completion-length reward of math and code.

    from gdpo_jax.tasks import get_task, load_task, register_task, TaskData
    task = get_task("math")
    examples = task.load("data/deepscaler.json")
    data = load_task(cfg)            # TaskData for cfg.task.name

A task declares the `config.task.kwargs` it takes as a table of `Kwarg`s
(`register_task(name, kwargs=...)`); `load_task` range-checks them first.
"""

from __future__ import annotations

import numbers
from typing import Any

from gdpo_jax.tasks.registry import (
    TASKS,
    Kwarg,
    SumAtMost,
    TaskData,
    TaskLoader,
    get_task,
    register_task,
)

# The modules whose import registers the built-in trainer tasks (and a rewards-only one).
BUILTIN_TASK_MODULES = (
    "gdpo_jax.tasks.sources",
    "gdpo_jax.tasks.toy",
    "gdpo_jax.tasks.three_binary",
    "gdpo_jax.tasks.format_cold_toy",
)


def _load_builtin_tasks() -> None:
    # Plain imports (not importlib strings), so the layout test sees these edges.
    # A failed import is its own error, not "not a registered task" later.
    mod = BUILTIN_TASK_MODULES[0]
    try:
        import gdpo_jax.tasks.sources  # noqa: F401  (toolcall, math, code)

        mod = BUILTIN_TASK_MODULES[1]
        import gdpo_jax.tasks.toy  # noqa: F401  (toy_toolcall)

        mod = BUILTIN_TASK_MODULES[2]
        import gdpo_jax.tasks.three_binary  # noqa: F401  (three_binary)

        mod = BUILTIN_TASK_MODULES[3]
        import gdpo_jax.tasks.format_cold_toy  # noqa: F401  (toy_correct_pm3 reward)
    except Exception as e:
        raise ImportError(
            f"importing the built-in tasks ({mod}) failed: {type(e).__name__}: {e}"
        ) from e


def task_kwargs(name: str) -> Any:
    """The kwargs table (a tuple of Kwarg / SumAtMost) task `name` was registered with;
    None when it declared none. The built-in tasks are registered first, so a task
    defined in a config file can take a built-in one's table."""
    from gdpo_jax.tasks import registry

    _load_builtin_tasks()
    return registry.task_kwargs(name)


def list_tasks() -> list[str]:
    """Sorted names of every registered trainer task (built-ins included)."""
    from gdpo_jax.tasks.registry import _TASKS

    _load_builtin_tasks()
    return sorted(_TASKS)


def check_task_kwargs(cfg: Any) -> None:
    """ConfigError naming `config.task.kwargs.<key>` when a key is unknown, of the wrong
    type or out of range for `cfg.task.name`'s kwargs table (a task registered without
    one is not checked here), or `config.task.source` / `eval_source` when they name a
    file for a task that reads none. Makes nothing: `load_task` calls it before the
    loader."""
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.tasks.registry import SYNTHETIC_ONLY, check_kwargs

    _load_builtin_tasks()
    t = cfg.task
    if t.name in SYNTHETIC_ONLY:  # its files would be ignored: it generates its records
        for field in ("source", "eval_source"):
            if t.get(field, "") not in ("", "synthetic"):
                fix = (
                    "set --config.task.source=synthetic"
                    if field == "source"
                    else "leave config.task.eval_source empty"
                )
                raise ConfigError(
                    f"config.task.{field}={t[field]!r} is not read by task {t.name!r}, which "
                    f"generates its records (config.task.kwargs); {fix}, or choose a task "
                    "that reads files."
                )
    table = task_kwargs(cfg.task.name)
    if table is None:
        return
    kw = cfg.task.get("kwargs") or {}
    check_kwargs(cfg.task.name, kw.to_dict() if hasattr(kw, "to_dict") else dict(kw), table)


def _prompt_kind(prompt: Any) -> str | None:
    """ "text", "messages" or "ids" (the prompt forms the sampler encodes), else None."""
    if isinstance(prompt, str):
        return "text"
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        return "messages"
    if (isinstance(prompt, (list, tuple)) or hasattr(prompt, "dtype")) and len(prompt):
        if all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
            return "ids"
    return None


def _check_prompts(task: str, split: str, records: list, field: str, chat_template: bool) -> None:
    """Every record's prompt, before the model build: the first 50 were checked, so a
    later record without one (or with None) failed after the build, in the length
    filter, which named prompts[0] whatever its index."""
    from gdpo_jax.errors import ConfigError

    for i, r in enumerate(records):
        prompt = r.get("prompt") if isinstance(r, dict) else None
        kind = _prompt_kind(prompt)
        if kind is None:
            missing = not isinstance(r, dict) or "prompt" not in r
            got = "no 'prompt' field" if missing else f"prompt={_short_repr(prompt)}"
            raise ConfigError(
                f"config.{field}: task {task!r}'s {split} record {i} has {got}; a prompt is "
                "text, a list of chat messages ({'role', 'content'} dicts) or a list of "
                "token ids."
            )
        if kind == "messages" and not chat_template:  # the sampler refused them after the build
            raise ConfigError(
                f"config.task.chat_template=False but task {task!r} gives chat messages (its "
                f"{split} record {i}'s prompt is a message list); set "
                "--config.task.chat_template=True."
            )


def _short_repr(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def load_task(cfg: Any) -> TaskData:
    """TaskData of `cfg.task.name`; ValueError naming the field when the task is unknown,
    ConfigError (one line, naming the field) when `config.task.kwargs` is bad (before any
    record is made), a data file is malformed or empty, or the records do not fit
    `config.task.chat_template`."""
    from gdpo_jax.tasks.registry import _TASKS

    _load_builtin_tasks()
    name = cfg.task.name
    if name not in _TASKS:
        raise ValueError(
            f"config.task.name={name!r} is not a known task; known: "
            f"{sorted(_TASKS)} (register more with gdpo_jax.tasks.register_task)."
        )
    from gdpo_jax.data.loaders import RecordError
    from gdpo_jax.errors import ConfigError

    check_task_kwargs(cfg)
    try:
        data = _TASKS[name](cfg)
    except TypeError as e:  # a task without a kwargs table: a key its generator does not take
        if "unexpected keyword argument" not in str(e):
            raise
        raise ConfigError(
            f"config.task.kwargs: task {name!r} failed to load ({e}); remove the key or "
            "check its spelling against the task's generator."
        ) from None
    except RecordError as e:  # a malformed or empty data file: one line naming the field
        # The loader tags a held-out file's error: matching the eval_source string inside
        # the path blamed the wrong field for a glob or a directory holding both splits.
        field = getattr(e, "config_field", "task.source")
        raise ConfigError(
            f"config.{field}: {e}; fix the file or point the field at another "
            "(record formats: docs/tasks-and-rewards.md)."
        ) from None
    if not data.train:
        raise ConfigError(f"config.task.source: task {name!r} produced no training records.")
    held_field = "task.eval_source" if cfg.task.get("eval_source", "") else "task.source"
    for split, records, field in (
        ("training", data.train, "task.source"),
        ("held-out", data.eval, held_field),
    ):
        _check_prompts(name, split, records, field, cfg.task.get("chat_template", True))
    return data


__all__ = [
    "BUILTIN_TASK_MODULES",
    "TASKS",
    "Kwarg",
    "SumAtMost",
    "TaskData",
    "TaskLoader",
    "check_task_kwargs",
    "get_task",
    "list_tasks",
    "load_task",
    "register_task",
    "task_kwargs",
]
