"""RewardRunner: scores a batch with K rewards on a bounded worker pool.

Rewards run on the host, off the compiled step, and may be slow (program
execution) or hang: each reward is called on chunks of the batch, chunks run
on `num_workers` threads (or, per reward, in a process pool for CPU-bound pure
Python), each call has a deadline, and the time spent per reward is reported.
A reward that can bound its own work (`fn.accepts_deadline = True`, as the code
rewards) is given that deadline as the keyword argument `deadline` (see
`deadline_for`), so that it ends in time on its own instead of being abandoned.

Conditioned rewards (paper eq. 8) are declared in the specs and gated here,
on the host, with the semantics of `gdpo_jax.core.gate_reward` (see `gate`).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
import multiprocessing
import pickle
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gdpo_jax.rewards.calls import _failed, _pool_call, _pool_ready, _run_chunk, _worker_init
from gdpo_jax.rewards.registry import DEADLINE_FIELD, get_reward

_EXECUTORS = ("thread", "process")
_ON_ERROR = ("raise", "nan")


@dataclasses.dataclass
class RewardSpec:
    """One reward of the run.

    name: registered reward name (also the column name; unique in a runner).
    weight: w_k passed to the advantage estimator (`RewardRunner.weights`).
    condition / threshold: gate this reward on another reward of the same
      runner: kept where that reward >= threshold, else 0.
    kwargs: keyword arguments for the reward function (e.g. max_tokens).
    executor: "thread" | "process" | None (the runner's default).
    """

    name: str
    weight: float = 1.0
    condition: str | None = None
    threshold: float = 1.0
    kwargs: dict = dataclasses.field(default_factory=dict)
    executor: str | None = None

    @classmethod
    def parse(cls, item: RewardSpec | str | Mapping[str, Any]) -> RewardSpec:
        """From a spec, a bare name, or a mapping (a config dict / ConfigDict)."""
        if isinstance(item, RewardSpec):
            return item
        if isinstance(item, str):
            return cls(item)
        if hasattr(item, "to_dict"):
            item = item.to_dict()
        if isinstance(item, Mapping):
            unknown = set(item) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise ValueError(
                    f"reward spec {dict(item)!r}: unknown keys {sorted(unknown)}; "
                    f"allowed: {[f.name for f in dataclasses.fields(cls)]}"
                )
            d = dict(item)
            d["kwargs"] = dict(d.get("kwargs") or {})
            return cls(**d)
        raise TypeError(f"cannot make a RewardSpec from {type(item).__name__}: {item!r}")


def gate(reward: np.ndarray, condition: np.ndarray, threshold: float) -> np.ndarray:
    """NumPy twin of gdpo_jax.core.gate_reward (no jax import on the host path).

    reward where condition >= threshold, else 0; NaN where the condition is
    NaN or +-inf (unscorable, so the gate cannot be decided and the gated reward
    is unscorable).
    """
    gated = np.where(condition >= threshold, reward, 0.0)
    return np.where(~np.isfinite(condition), np.nan, gated)


class RewardError(RuntimeError):
    """A reward function failed on a sample (or timed out on a chunk)."""

    def __init__(self, message: str, *, reward: str, index: int | None = None):
        super().__init__(message)
        self.reward = reward
        self.index = index


def _head(x: Any, n: int = 200) -> str:
    if isinstance(x, (list, tuple)) and x and isinstance(x[-1], Mapping):
        x = x[-1].get("content", x[-1])  # chat messages: the last turn
    s = str(x)
    return s if len(s) <= n else s[:n] + "..."


class RewardRunner:
    """Scores (prompts, completions, examples) with the given reward specs.

    Args:
      specs: RewardSpec | name | mapping, one per reward column.
      num_workers: worker threads (and process-pool size when used).
      timeout_s: deadline per reward call on a chunk, from when it starts.
        Rewards with `accepts_deadline` get `deadline=` (a time.monotonic()
        time a little before it, `deadline_for`) and end by it themselves.
      on_error: "raise" -> RewardError naming reward, function and sample;
        "nan" -> NaN for failing samples, counted in info.
      executor: default for specs with executor=None ("thread" | "process").
      chunk_size: samples per call; None = ceil(N / num_workers).
      imports: modules each process-pool worker imports first (where the
        rewards and their argument types are defined; config.imports).
    Call: runner(prompts, completions, examples, **extra_fields) ->
      (rewards f32[N, K] (gated, unweighted), info dict of floats:
       reward_time/<name> (worker-seconds), reward_failures/<name>,
       reward_timeouts/<name> (samples: chunks past the deadline, and samples a
       reward gave up on itself via RewardTimeouts), reward_nan/<name>,
       reward_time/total).
    """

    def __init__(
        self,
        specs: Sequence[RewardSpec | str | Mapping],
        *,
        num_workers: int = 4,
        timeout_s: float = 30.0,
        on_error: str = "raise",
        executor: str = "thread",
        chunk_size: int | None = None,
        imports: Sequence[str] = (),
    ):
        self.specs = [RewardSpec.parse(s) for s in specs]
        if not self.specs:
            raise ValueError("RewardRunner needs at least one reward spec")
        if on_error not in _ON_ERROR:
            raise ValueError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
        if executor not in _EXECUTORS:
            raise ValueError(f"executor must be one of {_EXECUTORS}, got {executor!r}")
        if num_workers < 1 or timeout_s <= 0:
            raise ValueError(
                f"need num_workers >= 1 and timeout_s > 0, got {num_workers}, {timeout_s}"
            )
        self.names = [s.name for s in self.specs]
        dup = {n for n in self.names if self.names.count(n) > 1}
        if dup:
            raise ValueError(f"reward names must be unique in a runner; repeated: {sorted(dup)}")
        self.fns = [get_reward(n) for n in self.names]
        self._order = self._gate_order()
        self._executors = []
        for s in self.specs:
            ex = s.executor or executor
            if ex not in _EXECUTORS:
                raise ValueError(
                    f"reward {s.name!r}: executor must be one of {_EXECUTORS}, got {ex!r}"
                )
            if ex == "process":
                try:
                    pickle.dumps(get_reward(s.name))
                except Exception as e:  # noqa: BLE001
                    raise ValueError(
                        f"reward {s.name!r} cannot run in a process pool: its function "
                        f"does not pickle ({e}); define it at module level"
                    ) from e
            self._executors.append(ex)
        self.num_workers, self.timeout_s, self.on_error = num_workers, timeout_s, on_error
        self.chunk_size = chunk_size
        self.imports = tuple(imports)
        self._threads = cf.ThreadPoolExecutor(num_workers, thread_name_prefix="reward")
        self._procs = None
        self._retired: list = []  # pools holding a timed-out job (see `_task`)
        self._lock, self._pool_lock = threading.Lock(), threading.Lock()

    @property
    def weights(self) -> np.ndarray:
        """f32[K] reward weights, in column order."""
        return np.asarray([s.weight for s in self.specs], np.float32)

    def _gate_order(self) -> list[int]:
        idx = {n: k for k, n in enumerate(self.names)}
        for s in self.specs:
            if s.condition is not None and s.condition not in idx:
                raise ValueError(
                    f"reward {s.name!r} is conditioned on {s.condition!r}, which is not "
                    f"one of this runner's rewards {self.names}"
                )
            if s.condition == s.name:
                raise ValueError(f"reward {s.name!r} cannot be conditioned on itself")
        order, state = [], {}

        def visit(k: int, path: list[str]) -> None:
            if state.get(k) == 2:
                return
            if state.get(k) == 1:
                raise ValueError(f"reward conditions form a cycle: {' -> '.join(path)}")
            state[k] = 1
            cond = self.specs[k].condition
            if cond is not None:
                visit(idx[cond], path + [cond])
            state[k] = 2
            order.append(k)

        for k in range(len(self.specs)):
            visit(k, [self.names[k]])
        return order

    def _proc_pool(self):
        with self._pool_lock:  # worker threads race to create it
            if self._procs is None:
                # Never fork a JAX process. No forkserver: killed by a signal to the group,
                # it left the pool counting live workers as exited, and a call hung.
                ctx = multiprocessing.get_context("spawn")
                started = ctx.Barrier(self.num_workers)
                pool = ctx.Pool(self.num_workers, _worker_init, (self.imports, started))
                # Started workers before any deadline runs: the pool's start-up (the
                # interpreters, config.imports) counted against the first jobs' timeout_s,
                # and each timed-out call's fresh pool paid it again, so a short timeout
                # scored every call NaN.
                try:
                    pool.map_async(_pool_ready, range(self.num_workers), chunksize=1).get(
                        max(60.0, 10 * self.timeout_s)
                    )
                except BaseException:
                    pool.terminate()
                    raise
                self._procs = pool
            return self._procs

    def __call__(
        self,
        prompts: Sequence,
        completions: Sequence[str],
        examples: Sequence[Mapping],
        **extra_fields: Sequence,
    ) -> tuple[np.ndarray, dict[str, float]]:
        n = len(completions)
        if len(prompts) != n or len(examples) != n:
            raise ValueError(
                f"prompts ({len(prompts)}), completions ({n}) and examples "
                f"({len(examples)}) must have one entry per completion"
            )
        fields = _fields(examples, extra_fields, n)
        t_start = time.perf_counter()
        size = self.chunk_size or max(1, math.ceil(n / self.num_workers))
        tasks = [
            (k, s, min(s + size, n)) for k in range(len(self.specs)) for s in range(0, n, size)
        ]
        started: dict[int, float] = {}

        def submit(i: int) -> cf.Future:
            return self._threads.submit(
                self._task, tasks[i], prompts, completions, fields, started, i
            )

        with self._lock:
            futs = {submit(i): i for i in range(len(tasks))}
            results, timed_out = self._collect(futs, started, [e - s for _, s, e in tasks], submit)
        raw = np.full((n, len(self.specs)), np.nan, np.float64)
        info = {
            f"reward_{m}/{nm}": 0.0
            for nm in self.names
            for m in ("time", "failures", "timeouts", "nan")
        }
        for i, (k, s, e) in enumerate(tasks):
            name = self.names[k]
            if i in timed_out:
                info[f"reward_timeouts/{name}"] += e - s
                info[f"reward_failures/{name}"] += e - s
                info[f"reward_time/{name}"] += self.timeout_s
                if self.on_error == "raise":
                    raise RewardError(
                        f"reward {name!r} ({_qualname(self.fns[k])}) timed out after "
                        f"{self.timeout_s}s on samples {s}..{e - 1}; first completion: "
                        f"{_head(completions[s])!r}",
                        reward=name,
                        index=s,
                    )
                continue
            vals, failures, secs, n_timeouts = results[i]
            raw[s:e, k] = vals
            info[f"reward_time/{name}"] += secs
            info[f"reward_timeouts/{name}"] += n_timeouts
            info[f"reward_failures/{name}"] += len(failures)
            if failures and self.on_error == "raise":
                off, text, exc = failures[0]
                j = s + off
                raise RewardError(
                    f"reward {name!r} ({_qualname(self.fns[k])}) failed on sample {j} "
                    f"(prompt: {_head(prompts[j])!r}; completion: {_head(completions[j])!r}): "
                    f"{text.strip()}\nSet on_error='nan' to score such samples NaN and count them.",
                    reward=name,
                    index=j,
                ) from exc
        for k in self._order:
            cond = self.specs[k].condition
            if cond is not None:
                raw[:, k] = gate(raw[:, k], raw[:, self.names.index(cond)], self.specs[k].threshold)
        for k, name in enumerate(self.names):
            info[f"reward_nan/{name}"] = float(np.isnan(raw[:, k]).sum())
        info["reward_time/total"] = time.perf_counter() - t_start
        return raw.astype(np.float32), info

    def deadline_for(self, start: float) -> float:
        """The `deadline` given to a reward call started at `start` (time.monotonic()).

        The runner gives up on the call at start + timeout_s; a margin (10% of
        timeout_s, at most 1 s) is kept for returning the values (from a worker
        process: pickled through a pipe). time.monotonic() is one clock for every
        process of the host, so the value holds in a process-pool worker too.
        """
        return start + self.timeout_s - min(1.0, 0.1 * self.timeout_s)

    def _task(self, task, prompts, completions, fields, started, i):
        k, s, e = task
        # A process job's clock starts once its pool is up (see _proc_pool).
        pool = self._proc_pool() if self._executors[k] == "process" else None
        started[i] = time.monotonic()
        sl = {key: v[s:e] for key, v in fields.items()}
        kwargs = self.specs[k].kwargs
        if getattr(self.fns[k], "accepts_deadline", False):
            kwargs = {**kwargs, DEADLINE_FIELD: self.deadline_for(started[i])}
        if pool is None:
            return _run_chunk(
                self.fns[k], prompts[s:e], completions[s:e], sl, kwargs, keep_exc=True
            )
        args = (self.fns[k], list(prompts[s:e]), list(completions[s:e]), sl, kwargs)
        try:
            blob = pickle.dumps(args)
        except Exception as ex:  # noqa: BLE001
            return _failed(
                e - s,
                f"{type(ex).__name__}: {ex} (the reward call cannot be sent to a worker "
                "process: its arguments do not pickle; use executor='thread')",
            )
        # Waiting here keeps at most num_workers process jobs in flight, so a
        # job starts when it is submitted and the deadline is honest, as long as
        # no worker is still busy with a job that timed out: that pool is retired
        # at once (later jobs get a fresh one) and terminated when the call ends.
        try:
            return pool.apply_async(_pool_call, (blob, e - s)).get(self.timeout_s)
        except multiprocessing.TimeoutError:
            with self._pool_lock:
                if self._procs is pool:
                    self._procs = None
                    self._retired.append(pool)
            raise

    def _collect(self, futs, started, sizes, submit):
        """Waits for the chunks' futures: {chunk: result}, and the chunks that ran past
        timeout_s. When hung chunks hold every worker thread, the chunks that never
        started go to a fresh pool (`submit`): they were scored NaN as timed out, a
        reward that hangs taking the rewards after it down with it."""
        results, timed_out, pending = {}, set(), set(futs)
        pool_of = dict.fromkeys(futs, self._threads)
        while pending:
            done, pending = cf.wait(pending, timeout=0.05)
            for f in done:
                i = futs[f]
                try:
                    results[i] = f.result()
                except multiprocessing.TimeoutError:
                    timed_out.add(i)
                except (Exception, SystemExit) as e:  # noqa: BLE001 - e.g. arguments that do not pickle
                    text = f"{type(e).__name__}: {e} (while dispatching the call)"
                    results[i] = (
                        [math.nan] * sizes[i],
                        [(j, text, e) for j in range(sizes[i])],
                        0.0,
                        0,
                    )
            now = time.monotonic()
            for f in list(pending):
                t = started.get(futs[f])
                if t is not None and now - t > self.timeout_s + 0.5:
                    timed_out.add(futs[f])
                    pending.discard(f)
            stuck = sum(
                1
                for f, i in futs.items()
                if i in timed_out and not f.done() and pool_of[f] is self._threads
            )
            if stuck >= self.num_workers:  # no worker left: the rest would never start
                waiting = [f for f in pending if futs[f] not in started and f.cancel()]
                if waiting:
                    self._threads.shutdown(wait=False)
                    self._threads = cf.ThreadPoolExecutor(
                        self.num_workers, thread_name_prefix="reward"
                    )
                for f in waiting:
                    pending.discard(f)
                    moved = submit(futs[f])
                    futs[moved], pool_of[moved] = futs[f], self._threads
                    pending.add(moved)
        if timed_out:
            # Hung threads cannot be killed: leave them and start a fresh
            # pool; hung processes can, so terminate their pool.
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = cf.ThreadPoolExecutor(self.num_workers, thread_name_prefix="reward")
            if self._procs is not None:
                self._procs.terminate()
                self._procs = None
        self._terminate_retired()
        return results, timed_out

    def _terminate_retired(self) -> None:
        with self._pool_lock:
            retired, self._retired = self._retired, []
        for pool in retired:
            pool.terminate()

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        if self._procs is not None:
            self._procs.terminate()
            self._procs = None
        self._terminate_retired()

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _qualname(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _fields(examples: Sequence[Mapping], extra: Mapping[str, Sequence], n: int) -> dict[str, list]:
    keys: dict[str, None] = {}
    for ex in examples:
        if not isinstance(ex, Mapping):
            raise TypeError(f"examples must be mappings (dict per sample), got {type(ex).__name__}")
        keys.update(dict.fromkeys(ex))
    keys.pop("prompt", None)  # passed positionally as `prompts`
    fields = {k: [ex.get(k) for ex in examples] for k in keys}
    for k, v in extra.items():
        v = v.tolist() if isinstance(v, np.ndarray) else list(v)
        if len(v) != n:
            raise ValueError(f"extra field {k!r} has {len(v)} entries for {n} completions")
        fields[k] = v
    for bad in ("prompts", "completions"):
        if bad in fields:
            raise ValueError(f"field name {bad!r} is reserved (it is a positional argument)")
    return fields
