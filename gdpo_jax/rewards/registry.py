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
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Sequence

RewardFn = Callable[..., Sequence[float]]

_REGISTRY: dict[str, RewardFn] = {}
_OPTIONS: dict[str, tuple[str, ...]] = {}  # options read from **kwargs, declared at registration
# Per-sample fields the trainer itself passes: not settable from the config.
_RUNNER_FIELDS = ("completion_lengths", "group_ids")
# Modules whose import registers the built-in task rewards; imported on the
# first lookup so that `import gdpo_jax.rewards` stays light (no jax, no sympy).
_BUILTIN_MODULES = ("gdpo_jax.tasks.toolcall", "gdpo_jax.tasks.math", "gdpo_jax.tasks.code")
_builtins_loaded = False


def register_reward(
    name: str, *, overwrite: bool = False, options: Sequence[str] = ()
) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering `fn` under `name` (error on a clash unless overwrite).

    options: keyword arguments `fn` reads from its `**kwargs` (named parameters with
      a default are found from the signature); config kwargs outside both are errors.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"reward name must be a non-empty string, got {name!r}")

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
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for mod in _BUILTIN_MODULES:
            importlib.import_module(mod)


def get_reward(name: str) -> RewardFn:
    """The reward registered under `name`; KeyError listing the known names."""
    if name not in _REGISTRY:
        _load_builtins()
    if name not in _REGISTRY:
        raise KeyError(
            f"unknown reward {name!r}; known rewards: {', '.join(list_rewards())}. "
            "Register new ones with @gdpo_jax.rewards.register_reward(name)."
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


@register_reward("length")
def length_reward(
    prompts: Sequence,
    completions: Sequence[str],
    *,
    max_tokens: int = 4000,
    completion_lengths: Sequence[int] | None = None,
    **kwargs,
) -> list[float]:
    """1.0 when the completion has at most `max_tokens` tokens, else 0.0.

    Token counts come from the `completion_lengths` field (the sampler's
    Rollouts.lengths, passed as an extra field to the runner) or, missing
    that, from `estimate_tokens`. Condition it on correctness with
    RewardSpec("length", condition="math_correct") (paper eq. 8).
    """
    if max_tokens <= 0:
        raise ValueError(f"length reward: max_tokens must be > 0, got {max_tokens}")
    counts = completion_token_counts(completions, completion_lengths)
    return [1.0 if n <= max_tokens else 0.0 for n in counts]
