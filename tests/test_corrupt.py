"""SFT targets (`gdpo_jax.data.corrupt.make_targets`) on every ground-truth layout the
tool-calling task accepts."""

import json
import re

import pytest

from gdpo_jax.data.corrupt import make_targets
from gdpo_jax.tasks import toolcall as tc

_CALLS = [
    {"name": "get_stock_price", "parameters": {"symbol": "AAPL"}},
    {"name": "get_stock_price", "parameters": {"symbol": "MSFT"}},
]


def _line(c: dict) -> str:
    return json.dumps(c, separators=(",", ":"))


# The layouts ToolRL-style data uses besides the canonical one: calls on the tags'
# lines, a blank line inside the block, CRLF line ends, two calls with a blank line.
LAYOUTS = {
    "canonical": "<think>x</think>\n<tool_call>\n{0}\n</tool_call>",
    "no newlines": "<think>x</think>\n<tool_call>{0}</tool_call>",
    "blank line": "<think>x</think>\n<tool_call>\n{0}\n\n</tool_call>",
    "CRLF": "<think>x</think>\r\n<tool_call>\r\n{0}\r\n</tool_call>",
    "two calls, blank between": "<think>x</think>\n<tool_call>\n{0}\n\n{1}\n</tool_call>",
}


def _records(layout: str) -> list[dict]:
    """Two records of `layout` whose symbols differ, so the value pool has two values."""
    a, b = _line(_CALLS[0]), _line(_CALLS[1])
    gts = [LAYOUTS[layout].format(a, b), LAYOUTS[layout].format(b, a)]
    return tc.load([{"prompt": "q", "reward_model": {"ground_truth": g}} for g in gts])


def _reference_calls(text: str) -> tuple[str, list[dict], str]:
    """(text before the block's calls, the calls, text after), by a regex of its own."""
    m = re.fullmatch(r"(.*?<tool_call>\s*)(.*?)(\s*</tool_call>.*)", text, re.S)
    assert m, text
    return m.group(1), [json.loads(x) for x in m.group(2).splitlines() if x.strip()], m.group(3)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_targets_of_every_accepted_layout(layout):
    # Before the shared parser make_targets split on "<tool_call>\n" and parsed every
    # line: IndexError (no newlines, CRLF) or JSONDecodeError (blank line), with all
    # noise 0, because the value pool reads every record.
    ex = _records(layout)  # the task's loader accepts the layout
    gts = [e["ground_truth"] for e in ex]
    assert make_targets(ex, "toolcall", seed=0) == gts

    wrong = make_targets(ex, "toolcall", seed=0, value_noise=1.0)
    for w, g in zip(wrong, gts):
        head, calls, tail = _reference_calls(w)
        ref_head, ref_calls, ref_tail = _reference_calls(g)
        assert (head, tail) == (ref_head, ref_tail)  # the framing is the reference's
        assert [c["name"] for c in calls] == [c["name"] for c in ref_calls]
        changed = [(c, r) for c, r in zip(calls, ref_calls) if c != r]
        assert len(changed) == 1  # one argument of one call, from the other record
        assert changed[0][0]["parameters"]["symbol"] in {"AAPL", "MSFT"}
        if "\r\n" in g:
            assert "\n" not in w.replace("\r\n", "")  # no bare LF in a CRLF target
