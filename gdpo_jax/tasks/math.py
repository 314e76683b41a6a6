"""Math (DeepScaleR setting): records, boxed-answer correctness, length, pass@1 eval.

Rewards:
  math_correct in {0, 1}: the LAST \\boxed{...} of the completion is
    equivalent to the reference: equal after `normalize_answer`, else
    math-verify's parse + verify (not equivalent when either side fails to parse).
    No boxed answer -> 0. A comparison past `verify_timeout_s` (5 s), or one
    left when the RewardRunner's deadline for the call has passed -> NaN,
    counted in reward_timeouts/math_correct.
  length in {0, 1} (gdpo_jax.tasks.length): <= max_tokens tokens; the
    paper conditions it on correctness: RewardSpec("length",
    condition="math_correct", kwargs={"max_tokens": 4000}).
"""

from __future__ import annotations

import decimal
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gdpo_jax.data.loaders import PathLike, RecordError, get_field, normalize_messages
from gdpo_jax.rewards.registry import RewardTimeouts, completion_token_counts, register_reward
from gdpo_jax.rewards.runner import RewardSpec
from gdpo_jax.tasks import length as _length  # noqa: F401  (registers "length")
from gdpo_jax.tasks.common import group_ids_for, load_records, mean_over_groups

# DeepScaleR / DeepSeek-R1 instruction.
PROMPT_TEMPLATE = (
    "{problem} Let's think step by step and output the final answer within \\boxed{{}}."
)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced; else None.

    Without a balanced braced one, the token after the last `\\boxed ` (a space
    after it; ends at whitespace or $), as verl's last_boxed_only_string reads it:
    `\\boxed 5`, but also `{6` of an unclosed `\\boxed {6`. A braced box wins over a
    later brace-less one.
    """
    starts = [m for m in _BOX.finditer(text)]
    if starts:
        m = starts[-1]
        depth, i = 1, m.end()
        while i < len(text):
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[m.end() : i].strip()
            i += 1
        # unbalanced: fall through to the brace-less form / none
    m2 = list(re.finditer(r"\\boxed\s+([^\s$]+)", text))
    return m2[-1].group(1).strip() if m2 else None


_WRAPPER = re.compile(r"\\(?:text|mathrm)\{")


def unwrap_text(s: str) -> str:
    """`\\text{X}` and `\\mathrm{X}` -> X, X running to the first `}` on its line, in
    one pass. The regex it replaces (a lazy `.*?` to `}` after either opener) took
    quadratic time on openers with no `}` on their line (48 KB of model output: 2 s of a
    reward thread, GIL held, past every timeout)."""
    out, i, close = [], 0, -1
    while (m := _WRAPPER.search(s, i)) is not None:
        if close < m.end():  # the next `}` at or after this opener, found once
            close = s.find("}", m.end())
            if close == -1:
                break  # no `}` left: no opener from here on can close
        newline = s.find("\n", m.end(), close)
        if newline != -1:  # no opener before that newline closes on its line
            out.append(s[i : newline + 1])
            i = newline + 1
            continue
        out.append(s[i : m.start()])
        out.append(s[m.end() : close])
        i = close + 1
    out.append(s[i:])
    return "".join(out)


def normalize_answer(s: str) -> str:
    """String fallback: drop spacing, $, \\left/\\right, text wrappers, trailing dot."""
    s = unwrap_text(s.strip().strip("$").strip())
    # \left( and \right), not \leftarrow / \rightarrow / \leftrightarrow.
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", s)
    for a, b in (
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("dfrac", "frac"),
        ("tfrac", "frac"),
        ("^\\circ", ""),
        ("^{\\circ}", ""),
        ("\\%", ""),
        ("%", ""),
    ):
        s = s.replace(a, b)
    s = re.sub(r"\s+", "", s).rstrip(".")
    return s.lower()


def is_equivalent(
    pred: str, gold: str, timeout_s: float = 5.0, deadline: float | None = None
) -> bool:
    """math-verify equivalence of two answer strings, or equal after normalize_answer.

    math-verify runs in a helper process (gdpo_jax.tasks.math_verifier) with a
    hard deadline: TimeoutError past `timeout_s` seconds (a pathological
    expression such as 9^{9^{9^{9}}} would otherwise hang the reward worker,
    GIL held, for ever), or past `deadline` (time.monotonic(); a helper's start-up
    included).
    """
    if normalize_answer(pred) == normalize_answer(gold):
        return True
    from gdpo_jax.tasks.math_verifier import verify_bounded

    return verify_bounded(pred, gold, timeout_s, deadline)


def _golds(gt: Any) -> list[str]:
    """The accepted answers of a reference: a list of them, or one text / number.

    NumPy values (Parquet gives arrays and scalars) go through ``tolist()`` first, so
    that a scalar stays one answer (np.str_("12") is "12", not ["1", "2"]).
    """
    if hasattr(gt, "tolist"):
        gt = gt.tolist()
    if isinstance(gt, (list, tuple)):
        return [_answer_text(g) for g in gt]
    return [_answer_text(gt)]


def _answer_text(g: Any) -> str:
    """A reference answer as text; a float in positional notation (str(1e-05) is
    '1e-05', which no written answer such as 0.00001 or 10^{-5} matches)."""
    if isinstance(g, float) and math.isfinite(g):
        return format(decimal.Decimal(repr(g)), "f")
    return str(g)


@register_reward("math_correct")
def correctness_reward(
    prompts: Sequence,
    completions: Sequence[str],
    *,
    ground_truth: Sequence[Any],
    verify_timeout_s: float = 5.0,
    **kwargs,
) -> list[float]:
    """{0, 1}: last boxed answer equivalent to (any of) the reference answer(s).

    A comparison past verify_timeout_s scores NaN (when no other reference
    matched) and raises RewardTimeouts with all the scores, which the
    RewardRunner keeps and counts in reward_timeouts/math_correct. Under a
    RewardRunner (`deadline`, a time.monotonic() time) no comparison runs past
    the call's deadline: once it has passed, an answer that is not equal to a
    reference after `normalize_answer` scores NaN too, unchecked.
    """
    if verify_timeout_s <= 0:
        raise ValueError(f"math_correct: verify_timeout_s must be > 0, got {verify_timeout_s}")
    deadline = kwargs.get("deadline")  # from the RewardRunner (accepts_deadline)
    out, timed_out = [], []
    for i, (c, gt) in enumerate(zip(completions, ground_truth)):
        ans, score = last_boxed(c), 0.0
        if ans is not None:
            for g in _golds(gt):
                if normalize_answer(ans) == normalize_answer(g):
                    score = 1.0
                    break
                budget = verify_timeout_s
                if deadline is not None:
                    # A few slow comparisons used to spend the whole call's time, and the
                    # runner then failed the chunk: every sample, correct ones too.
                    budget = min(budget, deadline - time.monotonic())
                    if budget <= 0:
                        score = math.nan
                        continue
                try:
                    if is_equivalent(ans, g, budget, deadline):
                        score = 1.0
                        break
                except TimeoutError:
                    score = math.nan
        out.append(score)
        if math.isnan(score):
            timed_out.append(i)
    if timed_out:
        raise RewardTimeouts(out, timed_out)
    return out


# The RewardRunner passes it its deadline (kwarg `deadline`): no chunk times out whole.
correctness_reward.accepts_deadline = True

# Suggested RewardRunner settings: sympy is slow per sample, keep chunks small.
RUNNER_DEFAULTS: dict = {"chunk_size": 8}


def default_rewards(
    max_tokens: int = 4000, conditioned: bool = True, executor: str | None = None
) -> list[RewardSpec]:
    """Correctness + length (<= max_tokens), length gated on correctness by default.

    executor="process" runs the reward in a process pool (parallel parsing);
    either way math-verify itself runs in a helper process per worker with a
    per-comparison deadline (kwargs verify_timeout_s, default 5 s).
    """
    return [
        RewardSpec("math_correct", executor=executor),
        RewardSpec(
            "length",
            condition="math_correct" if conditioned else None,
            kwargs={"max_tokens": max_tokens},
        ),
    ]


def normalize_record(rec: dict, path: str, row: int, template: str = PROMPT_TEMPLATE) -> dict:
    """DeepScaleR {problem, answer} or verl {prompt, reward_model.ground_truth} -> task record."""
    if "problem" in rec and "prompt" not in rec:
        problem = get_field(rec, "problem", path, row)
        if not isinstance(problem, str) or not problem.strip():
            raise RecordError(path, row, "problem", "must be non-empty text")
        prompt = [{"role": "user", "content": template.format(problem=problem.strip())}]
        field = "answer"
        gt = get_field(rec, field, path, row)
    else:
        prompt = normalize_messages(get_field(rec, "prompt", path, row), path, row)
        field = "reward_model.ground_truth"
        gt = get_field(rec, field, path, row, default=None)
        if gt is None:
            field = "answer"
            gt = get_field(rec, field, path, row)
    _check_scalar_answer(gt, path, row, field)
    golds = _golds(gt)
    if not golds or not all(g.strip() for g in golds):
        raise RecordError(path, row, field, f"reference answer is empty: {gt!r}")
    return {
        "prompt": prompt,
        "ground_truth": golds[0] if len(golds) == 1 else golds,
        "data_source": rec.get("data_source", "math"),
        "extra_info": rec.get("extra_info") or {},
        "solution": rec.get("solution"),
    }


def _check_scalar_answer(gt: Any, path: str, row: int, field: str) -> None:
    """A reference answer is text or a number, or a list of them (any one is accepted).

    Anything else (a dict, a nested list, None) would be str()-ed into a reference
    no completion can match, silently scoring every rollout 0.
    """
    items = gt.tolist() if hasattr(gt, "tolist") else gt
    items = list(items) if isinstance(items, (list, tuple)) else [items]
    for g in items:
        if not isinstance(g, (str, int, float)) or isinstance(g, bool):
            raise RecordError(
                path,
                row,
                field,
                f"reference answer must be text or a number (or a list of them), got "
                f"{type(g).__name__}: {g!r}",
            )


def load(
    path: PathLike | Sequence[PathLike] | Sequence[Mapping],
    *,
    split: str | None = None,
    backend: str = "auto",
    limit: int | None = None,
    template: str = PROMPT_TEMPLATE,
) -> list[dict]:
    """Math records from JSONL / JSON / Parquet (DeepScaleR, verl, synthetic arithmetic)."""
    norm = lambda r, f, i: normalize_record(r, f, i, template)  # noqa: E731
    return load_records(path, norm, split=split, backend=backend, limit=limit)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def evaluate(
    completions: Sequence[str],
    examples: Sequence[Mapping],
    *,
    completion_lengths: Sequence[int] | None = None,
    max_tokens: int = 4000,
    group_ids: Sequence[int] | None = None,
    correct: Sequence[float] | None = None,
    **kwargs,
) -> dict[str, float]:
    """Avg pass@1 over the k samples of each problem, and the Exceed ratio.

    completions[i] is a sample for examples[i]; samples of one problem share a
    group id (given, or found from identical prompts). `correct` skips
    re-scoring when the caller already has math_correct scores.
    Returns {"pass@1", "exceed_ratio" (share of samples over max_tokens),
    "mean_length", "num_problems", "samples_per_problem"}.
    """
    if correct is None:
        try:
            correct = correctness_reward(
                None, completions, ground_truth=[ex["ground_truth"] for ex in examples]
            )
        except RewardTimeouts as e:  # NaN there: left out of pass@1
            correct = e.values
    corr = np.asarray(correct, np.float64)
    groups = group_ids_for(examples, group_ids)
    lens = np.asarray(completion_token_counts(completions, completion_lengths), np.float64)
    n_prob = len(np.unique(groups))
    return {
        "pass@1": mean_over_groups(corr, groups),
        "exceed_ratio": float(np.mean(lens > max_tokens)),
        "mean_length": float(lens.mean()),
        "num_problems": float(n_prob),
        "samples_per_problem": float(len(corr) / max(n_prob, 1)),
    }
