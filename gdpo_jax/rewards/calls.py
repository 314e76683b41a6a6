"""One reward call on one chunk, in a worker thread or a process-pool worker.

Kept apart from the RewardRunner (scheduling, deadlines, gating): these are
the functions a worker process runs, so it imports nothing of the runner.
"""

from __future__ import annotations

import importlib
import math
import os
import pickle
import time
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np

from gdpo_jax.rewards.registry import RewardTimeouts


def _call(fn, prompts, completions, fields, kwargs) -> list[float]:
    out = fn(list(prompts), list(completions), **{**fields, **kwargs})  # spec kwargs win
    return _check(out, len(completions))


def _check(out, n: int) -> list[float]:
    if isinstance(out, np.ndarray):
        out = out.tolist()
    if not isinstance(out, Sequence) or isinstance(out, (str, bytes)):
        raise TypeError(f"must return a sequence of floats, got {type(out).__name__}")
    if len(out) != n:
        raise ValueError(f"returned {len(out)} values for {n} completions")
    vals = [math.nan if v is None else float(v) for v in out]
    bad = [i for i, v in enumerate(vals) if math.isinf(v)]
    if bad:
        raise ValueError(
            f"returned an infinite value at position {bad[0]} (use NaN for 'cannot score')"
        )
    return vals


def _run_chunk(fn, prompts, completions, fields, kwargs, keep_exc):
    """Scores one chunk; on failure re-scores sample by sample to find the culprit.

    Returns (values, failures, seconds, timeouts); failures = [(offset, text,
    exc|None)]; timeouts: samples the reward itself gave up on (RewardTimeouts).
    Runs in a worker thread or process (then exceptions travel as text).
    """
    t0 = time.perf_counter()
    try:
        return _call(fn, prompts, completions, fields, kwargs), [], time.perf_counter() - t0, 0
    except RewardTimeouts as e:
        try:
            vals = _check(e.values, len(completions))
            return vals, [], time.perf_counter() - t0, len(e.timed_out)
        except Exception:  # noqa: BLE001 - malformed values: find the culprit below
            pass
    except (Exception, SystemExit):  # noqa: BLE001 - any reward bug is reported, not swallowed
        pass
    vals, failures, n_timeouts = [], [], 0
    for i in range(len(completions)):
        one = {k: v[i : i + 1] for k, v in fields.items()}
        try:
            vals.extend(_call(fn, prompts[i : i + 1], completions[i : i + 1], one, kwargs))
        except RewardTimeouts as e:
            vals.append(math.nan)
            n_timeouts += len(e.timed_out)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - sys.exit() ended the run
            vals.append(math.nan)
            text = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}"
            failures.append((i, text, e if keep_exc else None))
    if not failures and not n_timeouts:  # only the batched call failed: blame the whole chunk
        try:
            _call(fn, prompts, completions, fields, kwargs)
        except (Exception, SystemExit) as e:  # noqa: BLE001
            text = f"{type(e).__name__}: {e} (fails on the batch, not on any single sample)"
            failures = [(i, text, e if keep_exc else None) for i in range(len(completions))]
            vals = [math.nan] * len(completions)
    return vals, failures, time.perf_counter() - t0, n_timeouts


# Set in a process-pool worker when one of its `imports` failed; reported by
# every call instead of the worker dying (which the pool would hide as a timeout).
_WORKER_INIT_ERROR: str | None = None
_STARTED: Any = None  # the pool's start-up barrier (`_pool_ready`), in a worker


def _worker_init(imports: tuple[str, ...], started: Any = None) -> None:
    global _WORKER_INIT_ERROR, _STARTED
    # Out of the trainer's process group: a signal sent to the group (SLURM's, or
    # `kill -TERM -<pgid>` on a preemption) reaches the trainer, which finishes its step
    # and saves (train/preemption.py). Killed with it, a busy worker's calls scored NaN
    # or timed out, and an idle one left the pool's task queue locked: the next call,
    # and the pool's terminate, waited for ever. The pool stops its workers by pid.
    os.setpgid(0, 0)
    _STARTED = started
    for m in imports:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001
            _WORKER_INIT_ERROR = (
                f"importing {m!r} (config.imports) failed in the reward worker process: "
                f"{type(e).__name__}: {e}"
            )
            return


def _failed(n: int, text: str):
    return [math.nan] * n, [(j, text, None) for j in range(n)], 0.0, 0


def _pool_ready(_: int) -> bool:
    """A start-up job, one per worker: each waits at the pool's barrier for the others,
    so that every worker has run `_worker_init` (left the trainer's process group)
    before the first call; without the barrier one worker could take every job."""
    if _STARTED is not None:
        _STARTED.wait()
    return True


def _pool_call(blob: bytes, n: int):
    """Runs in a worker process: unpickles the call itself, so that an import
    error there is reported as one (the pool would lose the task: a "timeout")."""
    if _WORKER_INIT_ERROR is not None:
        return _failed(n, _WORKER_INIT_ERROR)
    try:
        fn, prompts, completions, fields, kwargs = pickle.loads(blob)
    except Exception as e:  # noqa: BLE001
        return _failed(
            n,
            f"{type(e).__name__}: {e} (a reward worker process could not unpickle the call: "
            "it imports the reward function's module (and its arguments') by name. Define "
            "the reward in an importable module, list that module in config.imports "
            "(RewardRunner(imports=...)), or use executor='thread'.)",
        )
    return _run_chunk(fn, prompts, completions, fields, kwargs, keep_exc=False)
