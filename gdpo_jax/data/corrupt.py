"""SFT targets: each record's reference answer, optionally corrupted on purpose.

The replica's warm start must solve its task only partly, so the SFT targets
carry controlled label noise (`make_targets`): for tool calling a broken tag
structure or a wrong argument value taken from another record; for math a
wrong final answer or a verbose answer that restates the problem (and so
overruns a length budget). Pure Python on the records, deterministic given
the seed; used by `gdpo_jax.train.sft` (which re-exports `make_targets`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence

from gdpo_jax.data.tool_calls import call_block, ground_truth_calls

__all__ = ["SFT_TASKS", "make_targets"]

# Tasks whose records have a reference answer to train on.
SFT_TASKS: tuple[str, ...] = ("toolcall", "math")


def _calls(gt: str) -> list[dict]:
    return ground_truth_calls(gt) or []


def _with_calls(gt: str, calls: list[dict]) -> str:
    """`gt` with its first call block's calls replaced by `calls`, one compact JSON a line.

    The block keeps its own framing: the whitespace around the calls and its line
    end (CRLF or LF), so a target differs from its reference only in the calls.
    """
    start, end = call_block(gt)
    body = gt[start:end]
    calls_text = body.strip()
    lead = body[: len(body) - len(body.lstrip())]
    trail = body[len(body.rstrip()) :]
    sep = "\r\n" if "\r\n" in calls_text else "\n"
    text = sep.join(json.dumps(c, separators=(",", ":")) for c in calls)
    return f"{gt[:start]}{lead}{text}{trail}{gt[end:]}"


def _break_format(gt: str, r: random.Random) -> str:
    """One of three common ways to miss the ToolRL tag structure."""
    kind = r.randrange(3)
    if kind == 0 and "</think>\n" in gt:
        return gt.replace("</think>\n", "</think>", 1)  # missing newline
    if kind == 1:
        return gt.replace("</think>", "", 1)  # unclosed think
    return gt + "\nDone."  # text after the answer


def _wrong_value(gt: str, r: random.Random, pool: dict[str, list]) -> str:
    calls = _calls(gt)
    if not calls:
        return gt
    call = r.choice(calls)
    keys = [k for k in call["parameters"] if len(set(map(repr, pool.get(k, [])))) > 1]
    if not keys:
        return gt
    k = r.choice(keys)
    old = call["parameters"][k]
    while repr(call["parameters"][k]) == repr(old):
        call["parameters"][k] = r.choice(pool[k])
    return _with_calls(gt, calls)


_BOXED_INT = re.compile(r"^(.*)\\boxed\{(-?\d+)\}\s*$", re.S)


def _verbose_math(ex: dict, solution: str, i: int) -> str:
    """Restates the problem's sentences (not the question) before the worked answer.

    Only the synthetic arithmetic problems (gdpo_jax.data.synthetic) have the
    "... How many ...?" question it splits off.
    """
    text = ex["prompt"][-1]["content"]
    if " How many" not in text:
        raise ValueError(
            f"sft.verbose_prob: record {i}'s problem has no ' How many' question to split "
            "off (only the synthetic arithmetic task's do); set sft.verbose_prob=0."
        )
    facts = text.split(" How many")[0]
    return f"{facts} {solution}"


def _wrong_answer(solution: str, r: random.Random, i: int) -> str:
    """The solution with its final integer answer moved by 1 or 2 (synthetic arithmetic)."""
    m = _BOXED_INT.match(solution)
    if m is None:
        raise ValueError(
            f"sft.value_noise: record {i}'s solution does not end in \\boxed{{<integer>}} "
            "(only the synthetic arithmetic task's do); set sft.value_noise=0."
        )
    value = int(m.group(2)) + r.choice([-2, -1, 1, 2])
    return f"{m.group(1)}\\boxed{{{value}}}"


def make_targets(
    examples: Sequence[dict],
    task: str,
    *,
    seed: int,
    format_noise: float = 0.0,
    value_noise: float = 0.0,
    verbose_prob: float = 0.0,
) -> list[str]:
    """The SFT completion text of each example (reference answer, possibly corrupted).

    toolcall: `ground_truth`; with prob format_noise a broken tag structure,
    with prob value_noise one argument replaced by another record's value for
    the same key. math: `extra_info.solution`, with prob verbose_prob prefixed
    by the problem's facts, with prob value_noise a wrong final answer (both
    for the synthetic arithmetic records only: others raise, naming the field).
    Deterministic given seed.
    """
    r = random.Random(f"sft-targets-{seed}")
    out = []
    if task == "toolcall":
        pool: dict[str, list] = {}
        for ex in examples:
            for c in _calls(ex["ground_truth"]):
                for k, v in c["parameters"].items():
                    pool.setdefault(k, []).append(v)
        for ex in examples:
            t = ex["ground_truth"]
            if r.random() < value_noise:
                t = _wrong_value(t, r, pool)
            if r.random() < format_noise:
                t = _break_format(t, r)
            out.append(t)
    elif task == "math":
        for i, ex in enumerate(examples):
            sol = (ex.get("extra_info") or {}).get("solution") or ex.get("solution")
            if not sol:
                raise ValueError(
                    "math SFT needs a worked answer per record "
                    "(extra_info.solution or solution); the synthetic task has one."
                )
            if r.random() < value_noise:
                sol = _wrong_answer(sol, r, i)
            if r.random() < verbose_prob:
                sol = _verbose_math(ex, sol, i)
            out.append(sol)
    else:
        raise ValueError(f"config.task.name={task!r}: SFT targets exist for {SFT_TASKS} only.")
    return out
