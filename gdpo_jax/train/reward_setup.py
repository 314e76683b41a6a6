"""The config's rewards: custom imports, name and kwargs checks, RewardSpecs, the runner."""

from __future__ import annotations

import math
from typing import Any

import ml_collections as mlc

from gdpo_jax.errors import ConfigError
from gdpo_jax.train.schema import _choice, _suggest


def import_modules(cfg: mlc.ConfigDict) -> None:
    """Imports config.imports (custom rewards, tasks, tokenizers register on import)."""
    import importlib

    mods = cfg.get("imports", ())
    if isinstance(mods, str) or not all(isinstance(m, str) and m for m in mods):
        raise ConfigError(
            f"config.imports={mods!r} must be a tuple of module names, e.g. "
            "--config.imports='(\"my_pkg.rewards\",)'."
        )
    for m in mods:
        try:
            importlib.import_module(m)
        except Exception as e:
            raise ConfigError(
                f"config.imports: importing {m!r} failed ({type(e).__name__}: {e}); "
                "is it installed or on PYTHONPATH?"
            ) from e


def _check_rewards(cfg: mlc.ConfigDict, names: tuple, known: list | tuple | None) -> None:
    """Reward names resolve (registered, or an import path) and the sandbox is usable."""
    from gdpo_jax.rewards import get_reward, list_rewards
    from gdpo_jax.rewards.registry import _REGISTRY

    fns = {}
    for n in names:
        if known is not None and n in known:  # the caller vouches for it
            fns[n] = _REGISTRY.get(n)
            continue
        try:
            fns[n] = get_reward(n)
        except ImportError as e:
            raise ConfigError(f"config.rewards.names: {e}") from e
        except KeyError:
            try:
                known = list(known if known is not None else list_rewards())
            except ImportError as e:
                raise ConfigError(f"config.rewards.names: {e}") from e
            raise ConfigError(
                f"config.rewards.names: unknown reward {n!r}.{_suggest(n, tuple(known))} "
                f"Registered rewards: {sorted(known)}; or name one by import path "
                "'pkg.module:function' (or list its module in config.imports)."
            ) from None
    sb = cfg.rewards.get("sandbox", None)
    if sb is not None and any(getattr(f, "uses_sandbox", False) for f in fns.values()):
        from gdpo_jax.rewards import sandbox

        _choice(cfg, "rewards.sandbox.isolation", ("auto",) + sandbox.MODES)
        try:
            sandbox.isolation(sb.isolation, bool(sb.allow_weak))
            sandbox.self_check(sb.isolation, bool(sb.allow_weak))
        except RuntimeError as e:
            # The sandbox's own messages start "sandbox: "; the field names it once.
            raise ConfigError(
                f"config.rewards.sandbox: {str(e).removeprefix('sandbox: ')}"
            ) from None


def _check_reward_lists(cfg: mlc.ConfigDict, names: tuple) -> None:
    """rewards.weights / conditions / thresholds / executors: one entry per reward
    (or none), finite numbers, and conditions that name another reward, without a cycle."""
    r = cfg.rewards
    for field in ("weights", "conditions", "thresholds", "executors"):
        value = tuple(r.get(field, ()))
        if value and len(value) != len(names):
            raise ConfigError(
                f"config.rewards.{field} has {len(value)} entries but config.rewards.names has "
                f"{len(names)} ({names}); give one per reward, or () for the default."
            )
    for field in ("weights", "thresholds"):
        for i, w in enumerate(tuple(r.get(field, ()))):
            try:
                ok = not isinstance(w, (bool, str)) and math.isfinite(float(w))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                ones = ", ".join(["1.0"] * len(names))
                raise ConfigError(
                    f"config.rewards.{field}[{i}]={w!r} is not finite; pass finite numbers, "
                    f"one per reward, e.g. --config.rewards.{field}='({ones})'."
                )
    conditions = dict(zip(names, tuple(r.conditions)))
    for i, (n, t) in enumerate(zip(names, tuple(r.get("thresholds", ())))):
        # A threshold gates only a conditioned reward (eq. 8): elsewhere it was ignored,
        # so a gate the user meant to set silently did not exist. 1.0 is the default.
        if not conditions.get(n) and float(t) != 1.0:
            raise ConfigError(
                f"config.rewards.thresholds[{i}]={t!r} is for reward {n!r}, which has no "
                "condition, so it would be ignored; name the reward it gates on in "
                "config.rewards.conditions, or leave the threshold at 1.0."
            )
    for n, cond in conditions.items():
        if cond and cond not in names:
            raise ConfigError(
                f"config.rewards.conditions: reward {n!r} is conditioned on {cond!r}, which is "
                f"not in config.rewards.names={names}."
            )
        if cond == n:
            raise ConfigError(f"config.rewards.conditions: reward {n!r} conditioned on itself.")
    for n in names:  # follow each chain of gates: it must end
        path = [n]
        while conditions.get(path[-1]):
            path.append(conditions[path[-1]])
            if path[-1] in path[:-1]:
                raise ConfigError(
                    f"config.rewards.conditions form a cycle ({' -> '.join(path)}); a reward "
                    "can be gated on another only if that one is not gated on it, directly or "
                    "through others."
                )


def _check_reward_kwargs(cfg: mlc.ConfigDict, name: str) -> None:
    """A misspelled reward kwarg would be accepted and silently ignored by **kwargs."""
    from gdpo_jax.rewards.registry import check_reward_kwargs

    kw = cfg.rewards.kwargs[name]
    kw = kw.to_dict() if isinstance(kw, mlc.ConfigDict) else dict(kw)
    try:
        check_reward_kwargs(name, kw)
    except KeyError:  # not registered here (validated with an explicit known_rewards)
        return
    except ValueError as e:
        raise ConfigError(f"config.rewards.kwargs.{name}: {e}.") from None


def check_length_limits(cfg: mlc.ConfigDict) -> None:
    """The length reward's limit and the held-out exceed ratio's are one budget: set apart
    (one overridden, the other from the config file), the logged `length` column and
    `eval/exceed_ratio` measured two limits without a word."""
    if "length" not in tuple(cfg.rewards.names):
        return
    kw = cfg.rewards.kwargs.get("length", None)
    reward = None if kw is None else kw.get("max_tokens", None)
    held_out = cfg.task.eval_kwargs.get("max_tokens", None)
    if reward is not None and held_out is not None and reward != held_out:
        raise ConfigError(
            f"config.rewards.kwargs.length.max_tokens={reward} and "
            f"config.task.eval_kwargs.max_tokens={held_out} differ: the held-out exceed ratio "
            "is the share of answers over the length reward's limit; set both to one value."
        )


def reward_specs(cfg: mlc.ConfigDict) -> list:
    """The config's rewards as gdpo_jax.rewards.RewardSpec objects."""
    from gdpo_jax.rewards import RewardSpec, get_reward

    names = tuple(cfg.rewards.names)
    weights = tuple(cfg.rewards.weights) or (1.0,) * len(names)
    conditions = tuple(cfg.rewards.conditions) or ("",) * len(names)
    thresholds = tuple(cfg.rewards.thresholds) or (1.0,) * len(names)
    kwargs = cfg.rewards.kwargs.to_dict()
    executors = tuple(cfg.rewards.get("executors", ())) or ("",) * len(names)
    sb = cfg.rewards.get("sandbox", None)
    sandbox_kw = {"isolation": sb.isolation, "allow_weak": bool(sb.allow_weak)} if sb else {}

    def kw(n: str) -> dict:
        # The sandbox settings reach the rewards that run it; the reward's own
        # kwargs (config.rewards.kwargs) win.
        try:
            uses = bool(sandbox_kw) and getattr(get_reward(n), "uses_sandbox", False)
        except (KeyError, ImportError):  # the RewardRunner reports these, by name
            uses = False
        return {**(sandbox_kw if uses else {}), **kwargs.get(n, {})}

    return [
        RewardSpec(
            name=n,
            weight=float(w),
            condition=c or None,
            threshold=float(t),
            kwargs=kw(n),
            executor=e or None,
        )
        for n, w, c, t, e in zip(names, weights, conditions, thresholds, executors)
    ]


def reward_runner(cfg: mlc.ConfigDict, specs: list | None = None):
    """The config's gdpo_jax.rewards.RewardRunner (pools, deadline, error policy)."""
    from gdpo_jax.rewards import RewardRunner

    r = cfg.rewards
    return RewardRunner(
        specs if specs is not None else reward_specs(cfg),
        num_workers=r.num_workers,
        timeout_s=r.timeout_s,
        on_error=r.on_error,
        executor=r.get("executor", "thread"),
        chunk_size=int(r.get("chunk_size", 0)) or None,
        imports=tuple(cfg.get("imports", ())),
    )


def task_eval_kwargs(cfg: mlc.ConfigDict, specs: list | None = None) -> dict[str, Any]:
    """Keyword arguments for the task's `evaluate`: the settings of the rewards that run
    the sandbox (config.rewards.sandbox and their config.rewards.kwargs: isolation,
    cpu_s, max_tests, ...), so a held-out metric scores programs as the reward columns
    logged beside it do (code.evaluate ran with the defaults), then
    the length reward's `max_tokens` (the exceed ratio's limit), then
    config.task.eval_kwargs, which win. specs: `reward_specs(cfg)` when the caller has them."""
    from gdpo_jax.rewards import get_reward

    out: dict[str, Any] = {}
    for spec in reward_specs(cfg) if specs is None else specs:
        if spec.name == "length" and "max_tokens" in spec.kwargs:
            out["max_tokens"] = spec.kwargs["max_tokens"]  # the exceed ratio's limit too
        try:
            if getattr(get_reward(spec.name), "uses_sandbox", False):
                out.update(spec.kwargs)
        except (KeyError, ImportError):  # named by the runner, not here
            continue
    return {**out, **cfg.task.eval_kwargs.to_dict()}
