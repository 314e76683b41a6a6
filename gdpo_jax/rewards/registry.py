"""Reward registry: plain batch callables, selected by name from configs.

A reward function scores a batch:

    fn(prompts: list, completions: list[str], **fields) -> list[float]

`fields` holds one list per example column (e.g. ground_truth=[...], one
entry per completion), extra per-sample lists from the caller (e.g.
completion_lengths from the sampler) and the reward's own keyword arguments
from its `RewardSpec.kwargs`. Return NaN (or None) where a sample cannot be
scored. Accept `**kwargs` so that unrelated fields are ignored.

The keyword arguments a config may set for a reward (`config.rewards.kwargs.<name>`)
are its named parameters with a default, plus any it reads from `**kwargs` and
declares with `register_reward(name, options=(...))`; others are rejected.

    @register_reward("my_reward")
    def my_reward(prompts, completions, *, ground_truth, **kwargs):
        return [float(c.strip() == g) for c, g in zip(completions, ground_truth)]

A reward that bounds its own work sets `fn.accepts_deadline = True`: the
RewardRunner then passes `deadline=` (a `time.monotonic()` time, a little before
the runner's own deadline for the call) and the reward should return by then,
scoring what it had no time for itself (as the code rewards do: see
gdpo_jax.tasks.code), rather than being abandoned as a timeout.

A reward can also be named by import path, with no registration: "pkg.mod:fn"
(or "pkg.mod.fn") imports pkg.mod and uses its attribute fn, as TRL's
`--reward_funcs my_lib.rewards.fn` does; the path is then the reward's name.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Sequence

RewardFn = Callable[..., Sequence[float]]

_REGISTRY: dict[str, RewardFn] = {}
_OPTIONS: dict[str, tuple[str, ...]] = {}  # options read from **kwargs, declared at registration
# The keyword argument carrying the RewardRunner's deadline (`accepts_deadline`).
DEADLINE_FIELD = "deadline"
# Fields the trainer / runner itself passes: not settable from the config.
_RUNNER_FIELDS = ("completion_lengths", "group_ids", DEADLINE_FIELD)


class RewardTimeouts(Exception):  # noqa: N818 - a result carrier, not only an error
    """Raised by a reward that bounds its own per-sample work (e.g. math_correct).

    values: the batch's scores, NaN where it gave up; timed_out: those indices.
    The RewardRunner keeps the values and counts the indices in
    reward_timeouts/<name> (they are not failures of the reward).
    """

    def __init__(self, values: Sequence[float], timed_out: Sequence[int]):
        super().__init__(f"{len(timed_out)} sample(s) timed out")
        self.values, self.timed_out = list(values), list(timed_out)

    def __reduce__(self):  # pickles across the process pool with its fields
        return type(self), (self.values, self.timed_out)


# Modules whose import registers the built-in task rewards; imported on the
# first lookup so that `import gdpo_jax.rewards` stays light (no jax, no sympy).
# (Module names, not imports: the tasks sit above the rewards.)
_BUILTIN_MODULES = (
    "gdpo_jax.tasks.length",
    "gdpo_jax.tasks.toolcall",
    "gdpo_jax.tasks.math",
    "gdpo_jax.tasks.code",
    "gdpo_jax.tasks.toy",
    "gdpo_jax.tasks.three_binary",
    "gdpo_jax.tasks.format_cold_toy",
)
_builtins_loaded: set[str] = set()  # marked only once imported: a failure is retried


def register_reward(
    name: str, *, overwrite: bool = False, options: Sequence[str] = ()
) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering `fn` under `name` (error on a clash unless overwrite).

    options: keyword arguments `fn` reads from its `**kwargs` (named parameters with
      a default are found from the signature); config kwargs outside both are errors.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"reward name must be a non-empty string, got {name!r}")
    if "/" in name or name == "total":
        # Metrics are "reward/<name>/mean" beside the weighted "reward/total": a "/" or
        # "total" made two rewards (or a reward and the total) share one plot and one
        # summary entry, the last written hiding the other.
        raise ValueError(
            f"reward name {name!r} clashes with the metric names (reward/<name>/mean, "
            "reward/total): use a name without '/' other than 'total', e.g. "
            f"{name.replace('/', '_') if name != 'total' else 'total_score'!r}."
        )

    def deco(fn: RewardFn) -> RewardFn:
        if not callable(fn):
            raise TypeError(f"register_reward({name!r}) needs a callable, got {type(fn).__name__}")
        old = _REGISTRY.get(name)
        if old is not None and old is not fn and not overwrite and not _same_function(old, fn):
            raise ValueError(
                f"reward {name!r} is already registered ({_qualname(old)}); "
                "pick another name or pass overwrite=True"
            )
        _REGISTRY[name] = fn
        _OPTIONS[name] = tuple(options)
        return fn

    return deco


def _same_function(a: RewardFn, b: RewardFn) -> bool:
    # A module imported twice (e.g. a script run as __main__ and imported)
    # re-registers the same function: not a clash.
    return _qualname(a) == _qualname(b)


def _qualname(fn: RewardFn) -> str:
    mod = getattr(fn, "__module__", None) or "?"
    return f"{mod}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _load_builtins() -> None:
    for mod in _BUILTIN_MODULES:
        if mod in _builtins_loaded:
            continue
        try:
            importlib.import_module(mod)
        except Exception as e:
            # Not "unknown reward" later: the cause, now, and again on the next lookup.
            raise ImportError(
                f"importing the built-in rewards of {mod} failed: {type(e).__name__}: {e}"
            ) from e
        _builtins_loaded.add(mod)


def _from_import_path(name: str) -> RewardFn | None:
    """The callable at "pkg.mod:attr" / "pkg.mod.attr" (registered under `name`), or None."""
    if ":" in name:
        mod_name, attr = name.split(":", 1)
    elif "." in name:
        mod_name, attr = name.rsplit(".", 1)
    else:
        return None
    if not mod_name or not attr:
        return None
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise ImportError(
            f"reward {name!r}: cannot import module {mod_name!r} ({type(e).__name__}: {e}); "
            "is its package installed or on PYTHONPATH?"
        ) from e
    except Exception as e:  # noqa: BLE001 - the module itself failed: a traceback named no field
        raise ImportError(
            f"reward {name!r}: importing module {mod_name!r} failed ({type(e).__name__}: {e})."
        ) from e
    fn: object = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
    if not callable(fn):
        raise KeyError(f"reward {name!r}: module {mod_name!r} has no callable {attr!r}")
    _REGISTRY.setdefault(name, fn)  # type: ignore[arg-type]
    return _REGISTRY[name]


def get_reward(name: str) -> RewardFn:
    """The reward registered under `name`, or at import path "pkg.mod:fn".

    KeyError listing the known names; ImportError naming the module that failed.
    """
    if name not in _REGISTRY:
        _load_builtins()
    if name not in _REGISTRY and _from_import_path(name) is not None:
        return _REGISTRY[name]
    if name not in _REGISTRY:
        raise KeyError(
            f"unknown reward {name!r}; known rewards: {', '.join(list_rewards())}. "
            "Register new ones with @gdpo_jax.rewards.register_reward(name), or name one "
            "by import path 'pkg.module:function'."
        )
    return _REGISTRY[name]


def reward_options(name: str) -> tuple[str, ...] | None:
    """Keyword arguments a config may pass to reward `name` (None: cannot tell).

    Named parameters with a default (after `prompts, completions`) plus the declared
    `options`, less the per-sample fields the trainer supplies itself.
    """
    fn = get_reward(name)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return None
    named = [
        p.name
        for p in params[2:]
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is not p.empty
    ]
    return tuple(sorted(set(named + list(_OPTIONS.get(name, ()))) - set(_RUNNER_FIELDS)))


def check_reward_kwargs(name: str, kwargs: dict) -> None:
    """ValueError naming the reward, the unknown key(s) and the valid keys."""
    valid = reward_options(name)
    if valid is None:
        return
    bad = sorted(k for k in kwargs if k not in valid)
    if bad:
        raise ValueError(
            f"reward {name!r} takes no keyword argument(s) {bad}; valid keys: {list(valid)}"
        )


def list_rewards() -> list[str]:
    """Sorted names of every registered reward (built-ins included)."""
    _load_builtins()
    return sorted(_REGISTRY)


def estimate_tokens(text: str) -> int:
    """Token count estimate when the sampler's counts are not given.

    max(whitespace words, ceil(chars / 4)): ~4 characters per token is the
    usual BPE figure for English; the word count guards against long runs of
    short words. An estimate only: pass `completion_lengths` for exact counts.
    """
    return max(len(text.split()), math.ceil(len(text) / 4))


def completion_token_counts(
    completions: Sequence[str], completion_lengths: Sequence[int] | None
) -> list[int]:
    """Exact counts from the sampler when given, else `estimate_tokens`."""
    if completion_lengths is None:
        return [estimate_tokens(c) for c in completions]
    if len(completion_lengths) != len(completions):
        raise ValueError(
            f"completion_lengths has {len(completion_lengths)} entries for "
            f"{len(completions)} completions"
        )
    return [int(n) for n in completion_lengths]


class MovedError(ImportError):
    """A name that moved to another module: `from x import name` (and `x.name`) fail with
    the new path. An ImportError, since `from x import name` turns an AttributeError
    from a module's __getattr__ into a bare "cannot import name"."""


# Old name -> its new home. The task-specific `length` reward moved next to its tasks;
# re-exporting it here would import upward (rewards -> tasks).
MOVED = {"length_reward": "gdpo_jax.tasks.length"}


def moved(module: str, name: str) -> MovedError:
    """The error for `module.name`, which now lives in MOVED[name]."""
    new = MOVED[name]
    return MovedError(
        f"{module}.{name} moved to {new}.{name}: import it from there "
        f"(`from {new} import {name}`); the reward's registered name is unchanged."
    )


def __getattr__(name: str):
    if name in MOVED:
        raise moved(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
