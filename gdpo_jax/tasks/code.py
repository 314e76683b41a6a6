"""Code (Eurus-2-RL / APPS setting): records, sandboxed test rewards, evaluation.

Tests: {"inputs": [...], "outputs": [...]} for stdin/stdout problems, plus
"fn_name" for function-call problems (inputs = argument lists; the function
is top-level or a method of class Solution, LeetCode style).

Rewards (the program = the last ```python block of the completion):
  code_pass_rate in [0, 1]: share of test cases passed.
  code_bug in {0, 1}: 1 when the program compiles and no case raises a
    runtime error / hits the memory or output limit (a timeout alone is not a
    bug); 0 without a code block.
  length (generic), conditioned on code_pass_rate >= 1.0.
Both rewards share one sandbox run per (program, tests, limits): results are
memoized with single flight, so pass rate and bug cost one execution.

Under a RewardRunner both take its `deadline` (`accepts_deadline`): the
programs of a call share the time left, each getting at least an equal share
of it, and a program's sandbox ends before its share does. What a program
had no time for fails as "timeout" (pass 0): no program can make the runner
time out (RewardError, or NaN for the whole chunk).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gdpo_jax.data.loaders import PathLike, RecordError, get_field, normalize_messages
from gdpo_jax.rewards.registry import (
    RewardTimeouts,
    completion_token_counts,
    register_reward,
)
from gdpo_jax.rewards.runner import RewardSpec
from gdpo_jax.rewards.sandbox import ProgramResult, SandboxLimits, run_program
from gdpo_jax.tasks import length as _length  # noqa: F401  (registers "length")
from gdpo_jax.tasks.code_judge import stdout_matches, value_matches
from gdpo_jax.tasks.common import load_records, parse_json_field

STDIN_TEMPLATE = (
    "{question}\n\nWrite a Python 3 program that reads the input from standard input "
    "and prints the answer to standard output. Give the complete program in a "
    "```python code block."
)
CALL_TEMPLATE = (
    "{question}\n\nComplete the Python 3 function below and give the complete code in a "
    "```python code block.\n```python\n{starter}\n```"
)
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str | None:
    """The last fenced ```python (or ```py / ```python3) block; None if there is none."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else None


class _Memo:
    """Bounded LRU of sandbox runs with single flight (concurrent callers of
    the same key wait for one execution instead of starting their own)."""

    def __init__(self, size: int = 2048):
        self._d: collections.OrderedDict[str, cf.Future] = collections.OrderedDict()
        self._lock, self._size = threading.Lock(), size

    def get(self, key: str, compute, timeout: float | None = None, keep=None) -> Any:
        """compute() once per key; a caller waiting on another's run waits at most
        `timeout` seconds (cf.TimeoutError after it; the run goes on for its owner).
        keep(value) False: the value goes to the callers of this run only, not later ones."""
        with self._lock:
            fut = self._d.get(key)
            owner = fut is None
            if owner:
                fut = self._d[key] = cf.Future()
                while len(self._d) > self._size:
                    self._d.popitem(last=False)
            else:
                self._d.move_to_end(key)
        if owner:
            try:
                value = compute()
                fut.set_result(value)
                if keep is not None and not keep(value):  # its waiters have it; later calls redo it
                    with self._lock:
                        if self._d.get(key) is fut:
                            self._d.pop(key)
            except BaseException as e:
                fut.set_exception(e)
                with self._lock:
                    self._d.pop(key, None)
        return fut.result(None if owner else timeout)


_MEMO = _Memo()
# The characters of a judged case's stdout / stderr a cached result keeps (the tails).
_KEPT_CHARS = 1000


# One shared default (SandboxLimits is frozen, so sharing it is safe).
_DEFAULT_LIMITS = SandboxLimits()


def _limits(kwargs: Mapping) -> tuple[SandboxLimits, str, bool, int | None]:
    names = {f for f in SandboxLimits.__dataclass_fields__}
    lim = SandboxLimits(**{k: v for k, v in kwargs.items() if k in names})
    iso, weak = kwargs.get("isolation", "auto"), bool(kwargs.get("allow_weak", False))
    return lim, iso, weak, kwargs.get("max_tests")


def run_tests(
    code: str,
    tests: Mapping,
    *,
    limits: SandboxLimits = _DEFAULT_LIMITS,
    isolation: str = "auto",
    allow_weak: bool = False,
    max_tests: int | None = None,
    deadline: float | None = None,
) -> tuple[float, bool, ProgramResult]:
    """(pass rate, bug-free, raw result) of `code` on `tests`, memoized.

    deadline: `time.monotonic()` time by which to return (see `run_program`); not
    part of the memo key. Waiting on the same run started by another caller
    raises concurrent.futures.TimeoutError at the deadline.
    The raw result's return values are dropped once compared: the memo keeps
    thousands of results, and a decoded value may take ~20x its `value_bytes`.
    """
    ins, outs = list(tests["inputs"]), list(tests["outputs"])
    if max_tests is not None:
        ins, outs = ins[:max_tests], outs[:max_tests]
    fn = tests.get("fn_name") or None
    if not fn and outs:
        # Room for the expected stdout (twice, for the whitespace the judge ignores): a
        # right answer longer than output_bytes was cut, and failed.
        need = 2 * max(len(_stdout_text(o).encode()) for o in outs) + 4096
        if need > limits.output_bytes:
            limits = dataclasses.replace(limits, output_bytes=need)
    # Every setting that reaches run_program: a run under a weak mode (allow_weak) must
    # not answer for one that refused it.
    # Hashed: the text itself (a program and every test's input and output) was kept per
    # entry, up to 2,048 of them.
    key = hashlib.sha256(
        json.dumps(
            [code, ins, outs, fn, limits.__dict__, isolation, bool(allow_weak)],
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()

    def compute():
        res = run_program(
            code,
            ins,
            fn_name=fn,
            limits=limits,
            isolation_mode=isolation,
            allow_weak=allow_weak,
            deadline=deadline,
        )
        ok = [
            # A cut stdout is not the program's output: its kept head passed for it
            # (a right answer followed by 70,000 newlines and a wrong line).
            c.status == "ok"
            and not c.truncated
            and (value_matches(c.value, o) if fn else stdout_matches(c.stdout, _stdout_text(o)))
            for c, o in zip(res.cases, outs)
        ]
        # Judged: a cached result keeps what is read later (status, truncated) and the
        # tails of its output for a reader; whole outputs (64 KiB a case or more, 20 cases,
        # 2,048 entries) came to gigabytes.
        for c in res.cases:
            c.value, c.stdout, c.stderr = None, c.stdout[-_KEPT_CHARS:], c.stderr[-_KEPT_CHARS:]
        return (sum(ok) / len(outs) if outs else 0.0), not res.has_error, res

    wait = None if deadline is None else max(0.0, deadline - time.monotonic())
    # A run the caller's deadline cut short is not the program's own result: a later
    # call (next step, more time) runs it again instead of reusing its timeouts.
    return _MEMO.get(key, compute, wait, keep=lambda r: not r[2].cut_short)


def _stdout_text(expected: Any) -> str:
    """An expected stdout: text, or a list of lines joined as the driver joins an
    input given as lines (str() of the list would be "['1', '2']")."""
    if isinstance(expected, list):
        return "\n".join(map(str, expected))
    return str(expected)


def _scores(completions, tests, kwargs, which: int) -> list[float]:
    lim, iso, weak, max_tests = _limits(kwargs)
    deadline = kwargs.get("deadline")  # from the RewardRunner (accepts_deadline)
    codes = [extract_code(c) for c in completions]
    left = sum(c is not None for c in codes)
    out, waited_out = [], []
    for i, (code, t) in enumerate(zip(codes, tests)):
        if code is None:
            out.append(0.0)
            continue
        # An equal share of the time left, so that no program of the chunk eats
        # another's time; what a fast one leaves goes to those after it.
        share = None
        if deadline is not None:
            now = time.monotonic()
            share = now + max(0.0, deadline - now) / left
        left -= 1
        try:
            rate, bug_free, res = run_tests(
                code,
                t,
                limits=lim,
                isolation=iso,
                allow_weak=weak,
                max_tests=max_tests,
                deadline=share,
            )
        except cf.TimeoutError:
            # The same program is running for another call (the other reward) that
            # started later: not scored in time here, through no fault of its own.
            out.append(math.nan)
            waited_out.append(i)
            continue
        if any(c.status == "sandbox_error" for c in res.cases):
            out.append(math.nan)  # the sandbox itself failed: cannot score
        else:
            out.append(rate if which == 0 else float(bug_free))
    if waited_out:
        raise RewardTimeouts(out, waited_out)
    return out


# Keyword arguments the code rewards read from **kwargs (config.rewards.kwargs.code_*).
_REWARD_OPTIONS = (*SandboxLimits.__dataclass_fields__, "isolation", "allow_weak", "max_tests")


@register_reward("code_pass_rate", options=_REWARD_OPTIONS)
def pass_rate_reward(
    prompts: Sequence, completions: Sequence[str], *, tests: Sequence[Mapping], **kwargs
) -> list[float]:
    """[0, 1] share of passed tests.

    kwargs: SandboxLimits fields, isolation, allow_weak (see gdpo_jax.rewards.sandbox), max_tests.
    """
    return _scores(completions, tests, kwargs, 0)


@register_reward("code_bug", options=_REWARD_OPTIONS)
def bug_reward(
    prompts: Sequence, completions: Sequence[str], *, tests: Sequence[Mapping], **kwargs
) -> list[float]:
    """{0, 1}: 1 when the program runs without compile/runtime error."""
    return _scores(completions, tests, kwargs, 1)


# Marks the rewards that run the sandbox: config.reward_specs gives them
# config.rewards.sandbox, and validate_config checks the isolation up front.
pass_rate_reward.uses_sandbox = bug_reward.uses_sandbox = True
# The RewardRunner passes them its deadline (kwarg `deadline`): see _scores.
pass_rate_reward.accepts_deadline = bug_reward.accepts_deadline = True


# Suggested RewardRunner settings: one program per call, so the per-call
# deadline is per program (all its tests) and programs run in parallel. The
# sandbox ends a program before that deadline (cases left: "timeout").
RUNNER_DEFAULTS: dict = {"chunk_size": 1, "timeout_s": 120.0}


def default_rewards(max_tokens: int = 4000, bug: bool = True) -> list[RewardSpec]:
    """Pass rate, length gated on pass rate == 1, and (3 objectives) bug."""
    specs = [
        RewardSpec("code_pass_rate"),
        RewardSpec(
            "length", condition="code_pass_rate", threshold=1.0, kwargs={"max_tokens": max_tokens}
        ),
    ]
    return specs + [RewardSpec("code_bug")] if bug else specs


def _tests(value: Any, path: str, row: int, field: str) -> dict:
    t = parse_json_field(value, path, row, field)
    if not isinstance(t, Mapping):
        raise RecordError(path, row, field, "tests must be an object with 'inputs' and 'outputs'")
    for k in ("inputs", "outputs"):
        if not isinstance(t.get(k), list):
            raise RecordError(path, row, f"{field}.{k}", "missing or not a list")
    if len(t["inputs"]) != len(t["outputs"]) or not t["inputs"]:
        raise RecordError(
            path,
            row,
            field,
            f"need as many outputs as inputs (>= 1), got "
            f"{len(t['inputs'])} inputs and {len(t['outputs'])} outputs",
        )
    out = {"inputs": t["inputs"], "outputs": t["outputs"], "fn_name": t.get("fn_name") or None}
    if out["fn_name"] is None and not all(isinstance(x, (str, list)) for x in out["inputs"]):
        raise RecordError(
            path, row, f"{field}.inputs", "stdin inputs must be strings (or lists of lines)"
        )
    return out


def _question(rec: dict, path: str, row: int) -> str:
    """The record's problem statement: non-empty text, else a RecordError naming it."""
    q = get_field(rec, "question", path, row)
    if not isinstance(q, str) or not q.strip():
        raise RecordError(path, row, "question", "must be non-empty text")
    return q


def normalize_record(rec: dict, path: str, row: int) -> dict:
    """Eurus/verl {prompt, reward_model.ground_truth (tests JSON)}, APPS {question,
    input_output, starter_code} or {prompt|question, tests} -> task record."""
    if "input_output" in rec:  # APPS / TACO
        tests = _tests(rec["input_output"], path, row, "input_output")
        q = _question(rec, path, row)
        starter = rec.get("starter_code") or ""
        if not isinstance(starter, str):  # str.strip() below raised a bare AttributeError
            raise RecordError(path, row, "starter_code", "must be text (or empty)")
        text = (
            CALL_TEMPLATE.format(question=q.strip(), starter=starter.strip())
            if tests["fn_name"] and starter.strip()
            else STDIN_TEMPLATE.format(question=q.strip())
        )
        prompt = [{"role": "user", "content": text}]
    else:
        if "prompt" in rec:
            prompt = normalize_messages(rec["prompt"], path, row)
        else:
            q = _question(rec, path, row)
            prompt = [{"role": "user", "content": STDIN_TEMPLATE.format(question=q.strip())}]
        field = "reward_model.ground_truth" if "reward_model" in rec else "tests"
        tests = _tests(get_field(rec, field, path, row), path, row, field)
    return {
        "prompt": prompt,
        "tests": tests,
        "data_source": rec.get("data_source", "code"),
        "extra_info": rec.get("extra_info") or {},
    }


def load(
    path: PathLike | Sequence[PathLike] | Sequence[Mapping],
    *,
    split: str | None = None,
    backend: str = "auto",
    limit: int | None = None,
) -> list[dict]:
    """Code records from JSONL / JSON / Parquet (Eurus-2-RL code, APPS, TACO)."""
    return load_records(path, normalize_record, split=split, backend=backend, limit=limit)


def evaluate(
    completions: Sequence[str],
    examples: Sequence[Mapping],
    *,
    completion_lengths: Sequence[int] | None = None,
    max_tokens: int = 4000,
    **kwargs,
) -> dict[str, float]:
    """{"pass_rate" (mean share of tests), "all_pass" (share passing every test),
    "bug_ratio" (share with compile/runtime errors or no code), "exceed_ratio",
    "num_samples", "unscored" (samples the sandbox could not score: NaN, left out of
    the first three alike; all_pass counted them as failing and bug_ratio as bug-free)}.
    kwargs: sandbox settings as for the rewards (the trainer passes the rewards' own)."""
    tests = [ex["tests"] for ex in examples]
    rate = np.asarray(pass_rate_reward(None, completions, tests=tests, **kwargs), np.float64)
    bug = np.asarray(bug_reward(None, completions, tests=tests, **kwargs), np.float64)
    lens = np.asarray(completion_token_counts(completions, completion_lengths))
    ok = ~np.isnan(rate) & ~np.isnan(bug)

    def share(x: np.ndarray) -> float:
        return float(np.mean(x[ok])) if ok.any() else float("nan")

    return {
        "pass_rate": share(rate),
        "all_pass": share(rate >= 1.0),
        "bug_ratio": share(bug == 0.0),
        "exceed_ratio": float(np.mean(lens > max_tokens)) if len(lens) else float("nan"),
        "num_samples": float(len(rate)),
        "unscored": float(np.sum(~ok)),
    }
