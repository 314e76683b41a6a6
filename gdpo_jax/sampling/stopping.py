"""Host-side stop strings: cut a completion at the first stop-string occurrence.

A string can span several tokens and tokenize differently in context, so the
authority is the decoded text: the completion keeps the shortest token prefix
whose text (decoded without transformers' space clean-up, so that it only grows
with the prefix) contains a stop string (the stop string itself is kept, like
vLLM's ``include_stop_str_in_output=True``), and the text is cut right after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def first_stop_end(text: str, stop_strings: Sequence[str]) -> int | None:
    """End offset of the earliest-ending stop string occurrence in text, or None."""
    ends = [text.find(s) + len(s) for s in stop_strings if s in text]
    return min(ends) if ends else None


def apply_stop_strings(
    tokenizer: Any,
    stop_strings: Sequence[str],
    tokens: np.ndarray,
    lengths: np.ndarray,
    finish: list[str],
    texts: list[str],
) -> None:
    """Truncates rows in place (lengths, finish, texts; tokens past length are
    masked by the caller).

    tokens i32[N, C]; lengths i32[N]; finish / texts: per-row lists.
    """

    def decode(row: int, k: int, **kw: Any) -> str:
        return tokenizer.decode(tokens[row, :k].tolist(), skip_special_tokens=True, **kw)

    def raw(row: int, k: int) -> str:
        # Without transformers' clean-up of spaces before punctuation, which a non-BPE
        # tokenizer applies: it rewrites a prefix's text once a later token arrives
        # (" '" -> "'"), so "contains a stop string" could turn off again as the prefix
        # grew, and the search below cut late or not at all.
        return decode(row, k, clean_up_tokenization_spaces=False)

    for r in range(tokens.shape[0]):
        n = int(lengths[r])
        if n == 0:
            continue
        # The raw text when it holds a stop string; else the cleaned one, when only the
        # clean-up made one (e.g. "x'" from "x '").
        if first_stop_end(raw(r, n), stop_strings) is not None:
            text_of = raw
        elif first_stop_end(texts[r], stop_strings) is not None:
            text_of = decode
        else:
            continue
        # "the prefix text contains a stop string" is monotone in the prefix length
        # (the raw text only grows): binary search the shortest prefix, O(log C)
        # decodes per row.
        lo, hi = 1, n
        while lo < hi:
            mid = (lo + hi) // 2
            if first_stop_end(text_of(r, mid), stop_strings) is None:
                lo = mid + 1
            else:
                hi = mid
        text = decode(r, lo)
        lengths[r] = lo
        finish[r] = "stop"
        end = first_stop_end(text, stop_strings)
        texts[r] = text if end is None else text[:end]
