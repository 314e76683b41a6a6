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

    def with_special(row: int, k: int) -> str:
        return tokenizer.decode(
            tokens[row, :k].tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    # A stop string that holds a special token ("\n<|im_start|>") never appears in text
    # decoded without special tokens: it is searched for in the text that keeps them
    # (the device's exact-sequence check misses it when the text before the token is
    # tokenized otherwise, e.g. "\n\n" as one token). The others in the text without
    # them, so that a plain stop string cannot match inside a special token's name.
    specials = [t for t in getattr(tokenizer, "all_special_tokens", ()) if t]
    special_stops = [s for s in stop_strings if any(t in s for t in specials)]
    plain_stops = [s for s in stop_strings if s not in special_stops]

    def shortest(row: int, n: int, text_of: Any, stops: Sequence[str]) -> int:
        # "the prefix text contains a stop string" is monotone in the prefix length
        # (these texts only grow): binary search the shortest prefix, O(log C) decodes.
        lo, hi = 1, n
        while lo < hi:
            mid = (lo + hi) // 2
            if first_stop_end(text_of(row, mid), stops) is None:
                lo = mid + 1
            else:
                hi = mid
        return lo

    for r in range(tokens.shape[0]):
        n = int(lengths[r])
        if n == 0:
            continue
        cuts = []
        if plain_stops:
            # The raw text when it holds a stop string; else the cleaned one, when only
            # the clean-up made one (e.g. "x'" from "x '").
            if first_stop_end(raw(r, n), plain_stops) is not None:
                cuts.append(shortest(r, n, raw, plain_stops))
            elif first_stop_end(texts[r], plain_stops) is not None:
                cuts.append(shortest(r, n, decode, plain_stops))
        if special_stops and first_stop_end(with_special(r, n), special_stops) is not None:
            cuts.append(shortest(r, n, with_special, special_stops))
        if not cuts:
            continue
        lo = min(cuts)
        text = decode(r, lo)
        lengths[r] = lo
        finish[r] = "stop"
        end = first_stop_end(text, stop_strings)
        texts[r] = text if end is None else text[:end]


def stop_sequences(tokenizer: Any, stop_strings: Sequence[str]) -> np.ndarray:
    """i32[S, L] right-aligned token sequences of the stop strings (-1 padded).

    A device-side early exit only: the host check on the decoded text stays the
    authority (a string can tokenize differently in context).
    """
    seqs = []
    for s in stop_strings:
        ids = tokenizer(s, add_special_tokens=False)["input_ids"]
        # Only a tokenization that decodes back to the string: one the vocabulary
        # cannot spell (a word mapped to <unk>) would stop every row that samples
        # the unknown id, while the text holds no stop string.
        if ids and s in tokenizer.decode(ids, skip_special_tokens=False):
            seqs.append(list(ids))
    width = max([len(s) for s in seqs] + [1])
    arr = np.full((len(seqs), width), -1, np.int32)
    for i, s in enumerate(seqs):
        arr[i, width - len(s) :] = s
    return arr
