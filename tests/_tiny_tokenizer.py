"""A tiny word-level Hugging Face tokenizer for tests and benchmarks (offline).

Vocabulary: ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<|user|>`` 3, ``<|assistant|>`` 4,
``<|system|>`` 5, then words ``w6 .. w{V-1}`` (token id i is the word ``w{i}``),
so any id the model can emit decodes. Words are split on whitespace and decoded
joined by single spaces. A small chat template renders message lists.
"""

from __future__ import annotations

import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tiny_tokenizer(vocab_size: int = 256) -> PreTrainedTokenizerFast:
    """Returns a PreTrainedTokenizerFast with exactly ``vocab_size`` ids."""
    if vocab_size <= len(SPECIALS):
        raise ValueError(f"vocab_size must exceed {len(SPECIALS)}, got {vocab_size}")
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # WordPiece's decoder with an unused prefix joins words by single spaces.
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<pad>",
        additional_special_tokens=list(SPECIALS[3:]),
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def words(ids) -> str:
    """Decoded text of ids, specials skipped: ``[6, 1, 7] -> "w6 w7"``."""
    return " ".join(f"w{int(i)}" for i in ids if int(i) >= len(SPECIALS))


def save_tiny_tokenizer(out_dir: str, vocab_size: int = 256) -> PreTrainedTokenizerFast:
    os.makedirs(out_dir, exist_ok=True)
    tok = make_tiny_tokenizer(vocab_size)
    tok.save_pretrained(out_dir)
    return tok
