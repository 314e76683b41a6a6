"""A package's names loaded on first use (PEP 562), for the packages whose `__init__`
would otherwise import flax, optax or orbax before a config check could refuse a run
(a leaf module: imports nothing from gdpo_jax).

    __getattr__, __dir__ = lazy_exports(__name__, {"Sampler": "gdpo_jax.sampling.sampler"})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package` (its `__name__`), whose name `n` in
    `names` is the attribute `n` of the module `names[n]`, imported when `n` is first
    read (`package.n`, `from package import n`) and then set on the package, so later
    reads skip the hook. Any other name raises AttributeError, as a module does."""
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(module), *names})

    return __getattr__, __dir__
