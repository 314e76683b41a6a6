"""Tool calling (ToolRL setting): records, format / correctness rewards, BFCL-style eval.

Ground truth (verl record `reward_model.ground_truth`) is text such as

    <think>...</think>
    <tool_call>
    {"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}
    </tool_call>

with one JSON call per line, and/or a `<response>...</response>` block.

Rewards (ToolRL, as the GDPO paper uses them):
  toolcall_format in {0, 1}: the completion (stripped) is exactly
    <think>..</think>\\n<tool_call>\\n..\\n</tool_call>   (calls expected)
    <think>..</think>\\n<response>..</response>           (reply expected)
    <think>..</think>\\n<tool_call>\\n..\\n</tool_call>\\n<response>..</response>
    <think>..</think>                                     (neither)
    with each expected tag exactly once and no unexpected tag.
  toolcall_correctness in [-3, 3]: 0 if the ground truth has no tool call;
    -3 if the completion's calls cannot be parsed; 3 on an exact match;
    else 6 * score / max_score - 3 (see `tool_call_score`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gdpo_jax.data.loaders import PathLike, RecordError, get_field, normalize_messages
from gdpo_jax.data.tool_calls import ground_truth_calls
from gdpo_jax.rewards.registry import register_reward
from gdpo_jax.rewards.runner import RewardSpec
from gdpo_jax.tasks.common import load_records

_TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<response>", "</response>")
_PATTERNS = {
    (True, False): r"<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>",
    (False, True): r"<think>.*?</think>\n<response>.*?</response>",
    (True, True): r"<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>\n<response>.*?</response>",
    (False, False): r"<think>.*?</think>",
}


def match_score(a: Sequence, b: Sequence) -> float:
    """Frequency-aware Jaccard: |A & B| / (|A| + |B| - |A & B|) over multisets.

    Equal lists (same order) score 1 (so two empty lists score 1); one empty
    list scores 0.
    """
    if list(a) == list(b):
        return 1.0
    if not a or not b:
        return 0.0
    ca, cb = Counter(a), Counter(b)
    inter = sum(min(ca[k], cb[k]) for k in ca.keys() & cb.keys())
    return inter / (len(a) + len(b) - inter)


def parse_tool_calls(text: str) -> list[dict] | None:
    """Calls of the first <tool_call> block, one JSON object per line.

    None when there is no block or a line is not a {"name": str,
    "parameters": dict} object (the ToolRL parser: blank lines inside the
    block are errors, surrounding whitespace is not).
    """
    if "<tool_call>" not in text or "</tool_call>" not in text:
        return None
    body = text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0].strip()
    calls = []
    for line in body.split("\n"):
        try:
            c = json.loads(line)
        except (ValueError, RecursionError):
            # Not only JSONDecodeError: an integer of over 4300 digits (ValueError) or
            # ~1000 nested brackets (RecursionError) is model text too, and crashed the
            # reward instead of scoring it unparsable.
            return None
        if (
            not (
                isinstance(c, dict)
                and isinstance(c.get("name"), str)
                and isinstance(c.get("parameters"), dict)
            )
            or _nesting(c) > MAX_NESTING
        ):
            return None
        calls.append(c)
    return calls


# Deeper calls are unparsable. json.loads' own limit is the interpreter's recursion limit
# less the caller's stack: a call nested 990 deep scored 1.5 from a test and -3 under
# the RewardRunner (a deeper stack). No real tool call comes near this.
MAX_NESTING = 100


def _nesting(obj: Any) -> int:
    """Depth of nested dicts / lists in a decoded JSON value (iterative: no recursion)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        x, depth = stack.pop()
        if isinstance(x, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (x.values() if isinstance(x, dict) else x))
    return deepest


def tool_call_score(gt: Sequence[Mapping], pred: Sequence[Mapping]) -> float:
    """ToolRL correctness in [-3, 3] of parsed predicted calls against ground truth.

    score = match_score(gt names, pred names) + for each ground-truth call,
    the best still-unused predicted call of the same name scored as
    match_score(param keys) + number of gt params with an equal value;
    max_score = 1 + sum over gt calls of (1 + number of its params).
    Exact equality of the call lists (order included) gives 3.
    """
    if list(gt) == list(pred):
        return 3.0
    score = match_score([c["name"] for c in gt], [c["name"] for c in pred])
    max_score, used = 1.0, set()
    for g in gt:
        gp = g["parameters"]
        max_score += 1.0 + len(gp)
        best, best_i = 0.0, -1
        for i, p in enumerate(pred):
            if i in used or p["name"] != g["name"]:
                continue
            pp = p["parameters"]
            s = match_score(list(gp), list(pp)) + sum(
                1.0 for k, v in gp.items() if k in pp and pp[k] == v
            )
            if s > best:
                best, best_i = s, i
        if best_i >= 0:
            used.add(best_i)
            score += best
    return 6.0 * score / max_score - 3.0


def format_ok(completion: str, ground_truth: str) -> bool:
    """The tag structure the ground truth calls for, each tag once, nothing around."""
    want_call, want_resp = "<tool_call>" in ground_truth, "<response>" in ground_truth
    s = completion.strip()
    expect = {
        "<think>": 1,
        "</think>": 1,
        "<tool_call>": int(want_call),
        "</tool_call>": int(want_call),
        "<response>": int(want_resp),
        "</response>": int(want_resp),
    }
    if any(s.count(t) != n for t, n in expect.items()):
        return False
    return re.fullmatch(_PATTERNS[(want_call, want_resp)], s, re.DOTALL) is not None


@register_reward("toolcall_format")
def format_reward(
    prompts: Sequence, completions: Sequence[str], *, ground_truth: Sequence[str], **kwargs
) -> list[float]:
    """{0, 1}: see `format_ok`."""
    return [float(format_ok(c, g)) for c, g in zip(completions, ground_truth)]


@register_reward("toolcall_correctness")
def correctness_reward(
    prompts: Sequence, completions: Sequence[str], *, ground_truth: Sequence[str], **kwargs
) -> list[float]:
    """[-3, 3]: 0 if no call expected, -3 if unparseable, else `tool_call_score`."""
    out = []
    for c, g in zip(completions, ground_truth):
        gt = ground_truth_calls(g)
        if gt is None:
            out.append(0.0)
            continue
        pred = parse_tool_calls(c)
        out.append(-3.0 if pred is None else tool_call_score(gt, pred))
    return out


# Suggested RewardRunner settings: cheap string rewards, any chunking works.
RUNNER_DEFAULTS: dict = {}


def default_rewards() -> list[RewardSpec]:
    """The paper's two tool-calling rewards (format, correctness), weight 1 each."""
    return [RewardSpec("toolcall_format"), RewardSpec("toolcall_correctness")]


def normalize_record(rec: dict, path: str, row: int) -> dict:
    """verl record -> {"prompt", "ground_truth", "data_source", "extra_info"}.

    Accepts reward_model.ground_truth (verl / ToolRL) or a top-level
    ground_truth / answer; the ground truth's calls must parse.
    """
    prompt = normalize_messages(get_field(rec, "prompt", path, row), path, row)
    field = "reward_model.ground_truth"
    gt = get_field(rec, field, path, row, default=None)
    if gt is None:
        field = "ground_truth" if "ground_truth" in rec else "answer"
        gt = get_field(rec, field, path, row)
    if not isinstance(gt, str):
        raise RecordError(path, row, field, f"ground truth must be text, got {type(gt).__name__}")
    try:
        ground_truth_calls(gt)
    except (ValueError, json.JSONDecodeError) as e:
        raise RecordError(path, row, field, f"tool call does not parse: {e}") from e
    return {
        "prompt": prompt,
        "ground_truth": gt,
        "data_source": rec.get("data_source", "toolcall"),
        "extra_info": rec.get("extra_info") or {},
    }


def load(
    path: PathLike | Sequence[PathLike] | Sequence[Mapping],
    *,
    split: str | None = None,
    backend: str = "auto",
    limit: int | None = None,
) -> list[dict]:
    """Tool-calling records from JSONL / JSON / Parquet (ToolRL rlla_4k, synthetic)."""
    return load_records(path, normalize_record, split=split, backend=backend, limit=limit)


def _norm_value(v: Any) -> Any:
    # BFCL's AST checker compares strings loosely (case, spaces, punctuation)
    # and numbers by value (5 == 5.0); bools stay bools (tagged: True == 1.0 and
    # hash(True) == hash(1.0), so a bare bool would equal the number 1).
    if isinstance(v, bool):
        return ("__bool__", v)
    if v is None:
        return v
    if isinstance(v, (int, float)):
        # As they are, not float(v): 5 == 5.0 and hash(5) == hash(5.0) all the same, and
        # float() of a 310-digit int raised OverflowError and ended the run's eval.
        return v
    if isinstance(v, str):
        return re.sub(r"[\s,./\-_*^]", "", v).lower()
    if isinstance(v, (list, tuple)):
        return tuple(_norm_value(x) for x in v)
    if isinstance(v, Mapping):
        # Tagged like bools: untagged, {"a": 1} and [["a", 1]] had the same key.
        return ("__dict__", tuple(sorted((str(k), _norm_value(x)) for k, x in v.items())))
    return repr(v)


def ast_match(completion: str, ground_truth: str) -> bool:
    """BFCL-style AST accuracy of one sample.

    Calls expected: the parsed calls equal the ground truth as a multiset
    (order-free) of (name, normalized arguments), nothing missing or extra.
    No call expected (relevance): correct when the completion makes none.
    """
    gt = ground_truth_calls(ground_truth)
    if gt is None:
        return "<tool_call>" not in completion
    pred = parse_tool_calls(completion)
    if pred is None:
        return False
    key = lambda c: (c["name"], _norm_value(c["parameters"]))  # noqa: E731
    try:
        return Counter(map(key, gt)) == Counter(map(key, pred))
    except RecursionError:
        # Parameters nested ~500-990 deep parse (json.loads allows ~1000 levels) but
        # _norm_value takes two frames a level: the eval crashed and ended the run.
        return False


def evaluate(completions: Sequence[str], examples: Sequence[Mapping], **kwargs) -> dict[str, float]:
    """Held-out metrics: {"accuracy" (AST), "format" (share well formatted),
    "correctness" (mean reward), "num_samples"}."""
    gts = [ex["ground_truth"] for ex in examples]
    acc = [ast_match(c, g) for c, g in zip(completions, gts)]
    fmt = format_reward(None, completions, ground_truth=gts)
    cor = correctness_reward(None, completions, ground_truth=gts)
    return {
        "accuracy": float(np.mean(acc)),
        "format": float(np.mean(fmt)),
        "correctness": float(np.mean(cor)),
        "num_samples": float(len(gts)),
    }
