"""Tokenizers by name (`config.model.tokenizer` for a random-init model).

    @register_tokenizer("my_words")
    def make() -> PreTrainedTokenizerFast: ...

Built in: "synthetic_bpe" (gdpo_jax.data.tokenizer, built on first use) and
"toy_words" (registered by gdpo_jax.tasks.toy, the toy task's word tokenizer). A
local Hugging Face tokenizer directory works too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

_TOKENIZERS: dict[str, Callable[[], Any]] = {}


def register_tokenizer(name: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    """Decorator registering a zero-argument tokenizer builder under `name`."""

    def deco(fn: Callable[[], Any]) -> Callable[[], Any]:
        _TOKENIZERS[name] = fn
        return fn

    return deco


@register_tokenizer("synthetic_bpe")
def _synthetic_bpe() -> Any:
    # Registered here, not by an import side effect of gdpo_jax.data.tokenizer:
    # the name is known as soon as the registry is, and builds on first use.
    from gdpo_jax.data.tokenizer import load_tokenizer

    return load_tokenizer()


def list_tokenizers() -> list[str]:
    """Sorted registered tokenizer names."""
    return sorted(_TOKENIZERS)


# A directory holding one of these is a Hugging Face tokenizer directory.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def tokenizer_known(name: str) -> bool:
    """`name` is a registered tokenizer or a directory holding tokenizer files (what
    build_tokenizer loads; an empty directory failed there, with a traceback)."""
    if name in _TOKENIZERS:
        return True
    return bool(name) and any(os.path.isfile(os.path.join(name, f)) for f in TOKENIZER_FILES)


def build_tokenizer(name: str) -> Any:
    """A registered tokenizer builder, or a local Hugging Face tokenizer directory."""
    if name in _TOKENIZERS:
        return _TOKENIZERS[name]()
    if name and os.path.isdir(name):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    raise ValueError(
        f"config.model.tokenizer={name!r} is neither a registered tokenizer "
        f"({sorted(_TOKENIZERS)}) nor a tokenizer directory; a random-init model "
        "(config.model.name='') needs one."
    )
