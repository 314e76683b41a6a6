"""Prompts to token ids for the sampler: a string, a chat message list or token ids,
each checked against the model's vocabulary before anything is compiled."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def _require_tokenizer(tokenizer: Any, what: str) -> Any:
    if tokenizer is None:
        raise ValueError(
            f"Sampler(tokenizer=None) cannot encode {what}; pass a tokenizer or token-id prompts."
        )
    return tokenizer


def encode_prompts(
    tokenizer: Any, vocab_size: int, prompts: Sequence[Any], *, chat_template: bool = True
) -> list[list[int]]:
    """One id list per prompt: str -> tokenizer(str); message list -> chat template with
    the generation prompt; a sequence of ints -> used as is.

    Raises ValueError / TypeError naming the prompt for an empty encoding, a message list
    without `chat_template`, an unknown prompt type or an id outside [0, vocab_size).
    """
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            tok = _require_tokenizer(tokenizer, "string prompts")
            ids = tok(p, add_special_tokens=True)["input_ids"]
        elif isinstance(p, (list, tuple)) and p and all(isinstance(m, dict) for m in p):
            if not chat_template:
                raise ValueError(
                    f"prompts[{i}] is a message list but chat_template=False; pass "
                    "chat_template=True or render it to a string yourself."
                )
            tok = _require_tokenizer(tokenizer, "message-list prompts")
            text = tok.apply_chat_template(list(p), add_generation_prompt=True, tokenize=False)
            ids = tok(text, add_special_tokens=False)["input_ids"]
        elif isinstance(p, (list, tuple, np.ndarray)) and all(
            isinstance(t, (int, np.integer)) for t in p
        ):
            ids = [int(t) for t in p]
        else:
            raise TypeError(
                f"prompts[{i}] must be a str, a list of chat message dicts or a "
                f"list of token ids; got {type(p).__name__}."
            )
        if len(ids) == 0:
            raise ValueError(f"prompts[{i}] encodes to zero tokens; every prompt needs >= 1 token.")
        # An id past the vocabulary gave NaN log-probs under a mask of 1 (a negative
        # one wrapped to another token): a tokenizer larger than the model, or bad ids.
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"prompts[{i}] has token id {bad[0]} outside the model's vocabulary "
                f"[0, {vocab_size}); check the tokenizer matches the model."
            )
        out.append(list(ids))
    return out
