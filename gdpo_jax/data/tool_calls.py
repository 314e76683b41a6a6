"""The calls of a tool-calling ground truth (ToolRL's `<tool_call>` block), parsed leniently.

One parser for the task's loader and rewards (`gdpo_jax.tasks.toolcall`) and the
SFT targets (`gdpo_jax.data.corrupt`), so a record the task accepts is one its
targets can be built from. Lenient like ToolRL's ground-truth reading: the block
may sit on the tags' lines or not, with blank lines between calls and CRLF line
ends (completions are parsed strictly, by `tasks.toolcall.parse_tool_calls`).
"""

from __future__ import annotations

import json

__all__ = ["call_block", "ground_truth_calls"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def call_block(text: str) -> tuple[int, int] | None:
    """(start, end) offsets of the first `<tool_call>` block's body in `text`, or None.

    The body runs to the first `</tool_call>` after the opening tag, or to the
    end of the text when there is none.
    """
    i = text.find(_OPEN)
    if i < 0:
        return None
    start = i + len(_OPEN)
    end = text.find(_CLOSE, start)
    return start, len(text) if end < 0 else end


def ground_truth_calls(ground_truth: str) -> list[dict] | None:
    """The ground truth's calls, one JSON object per non-blank line of its first block.

    None when it has no `<tool_call>` (no call expected). Raises
    json.JSONDecodeError for a line that is not JSON and ValueError for one
    that is not a {"name": str, "parameters": object} call.
    """
    span = call_block(ground_truth)
    if span is None:
        return None
    body = ground_truth[span[0] : span[1]]
    calls = [json.loads(line) for line in body.strip().split("\n") if line.strip()]
    for c in calls:
        if not (
            isinstance(c, dict)
            and isinstance(c.get("name"), str)
            and isinstance(c.get("parameters"), dict)
        ):
            raise ValueError(
                f"ground-truth tool call {c!r} needs 'name' (str) and 'parameters' (object)"
            )
    return calls
