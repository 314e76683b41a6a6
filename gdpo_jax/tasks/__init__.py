"""The paper's three tasks. Each module provides `load(path, split=...)`
(records with at least "prompt" as chat messages and its reward fields),
`default_rewards()` (RewardSpecs) and `evaluate(completions, examples, ...)`.

    from gdpo_jax.tasks import get_task
    task = get_task("math")
    examples = task.load("data/deepscaler.json")
"""

import importlib
from types import ModuleType

TASKS = ("toolcall", "math", "code")


def get_task(name: str) -> ModuleType:
    """The task module `gdpo_jax.tasks.<name>` (imports register its rewards)."""
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return importlib.import_module(f"gdpo_jax.tasks.{name}")


__all__ = ["TASKS", "get_task"]
