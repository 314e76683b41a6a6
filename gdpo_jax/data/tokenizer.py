r"""A small byte-level BPE tokenizer for the synthetic tasks ("synthetic_bpe").

The CPU-scale replica trains a few-million-parameter policy from scratch, so
it needs a vocabulary of ~1k ids fitted to its own data rather than a 50k
vocabulary from a pretrained model. This module trains one, deterministically,
on the synthetic tool-calling and arithmetic corpus (prompts rendered with the
chat template + reference answers):

- byte level (GPT-2 style, no prefix space): every string round-trips exactly,
  whitespace and newlines included (the format reward checks `</think>\n`);
  digits are split one per token (arithmetic generalizes across numbers);
- special tokens (skipped when decoding): `<pad>` 0, `<s>` 1, `</s>` 2 (EOS),
  `<|system|>`, `<|user|>`, `<|assistant|>` (chat roles);
- task tags as single, non-special tokens, so they survive
  `decode(skip_special_tokens=True)`: `<think>`, `</think>`, `<tool_call>`,
  `</tool_call>`, `<response>`, `</response>`, `\boxed`;
- chat template: `<s><|system|>\n{content}\n<|user|>\n{content}\n<|assistant|>\n`.

    from gdpo_jax.data.tokenizer import load_tokenizer
    tok = load_tokenizer()               # PreTrainedTokenizerFast, ~1k ids, cached on disk
    python -m gdpo_jax.data.tokenizer --out_dir /tmp/synthetic_bpe   # writes tokenizer.json & co.

The trainer knows it as `config.model.tokenizer = "synthetic_bpe"`
(registered in gdpo_jax.data.tokenizer_registry, which imports this module on first use).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
TAG_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<response>",
    "</response>",
    "\\boxed",
)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
DEFAULT_VOCAB_SIZE = 1024
# Bump when anything that changes the trained tokenizer changes (invalidates the cache).
_VERSION = 1


def render_chat(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """CHAT_TEMPLATE in plain Python (for the corpus; equal to apply_chat_template)."""
    text = "<s>" + "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return text + ("<|assistant|>\n" if add_generation_prompt else "")


def corpus(n_toolcall: int = 2000, n_math: int = 2000, seed: int = 0) -> list[str]:
    """Training texts: each synthetic prompt (chat-rendered) followed by its reference answer.

    Both tasks, train split, deterministic given the arguments.
    """
    from gdpo_jax.data.synthetic import arithmetic_records, toolcall_records

    texts = []
    for r in toolcall_records(n_toolcall, seed=seed, split="train"):
        texts.append(render_chat(r["prompt"]) + r["reward_model"]["ground_truth"])
    for r in arithmetic_records(n_math, seed=seed, split="train"):
        texts.append(render_chat(r["prompt"]) + r["extra_info"]["solution"])
    return texts


def train_bpe(texts: Sequence[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Any:
    """A `tokenizers.Tokenizer` (byte-level BPE) with exactly `vocab_size` ids or fewer.

    Specials get ids 0..5 and the tags the next ids, before any merge, so the
    layout does not depend on the corpus.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    n_fixed = len(SPECIAL_TOKENS) + len(TAG_TOKENS)
    if vocab_size < n_fixed + 256:
        raise ValueError(
            f"vocab_size={vocab_size} must be >= {n_fixed + 256} "
            "(specials + tags + the 256 byte symbols)."
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
        + [AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    # The trainer registers all its "special_tokens" as special; the tags must
    # stay visible in decoded text, so re-declare them as plain added tokens.
    data = json.loads(tok.to_str())
    for entry in data["added_tokens"]:
        if entry["content"] in TAG_TOKENS:
            entry["special"] = False
    return Tokenizer.from_str(json.dumps(data))


def wrap(tok: Any) -> Any:
    """A transformers PreTrainedTokenizerFast around a `tokenizers.Tokenizer` (+ chat template)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", BOS_ID)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token=None,
        additional_special_tokens=list(SPECIAL_TOKENS[3:]),
        # In the constructor, so save_pretrained writes it (set after, an export loaded
        # back padded on the right).
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def cache_dir() -> str:
    root = os.environ.get(
        "GDPO_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "gdpo_jax")
    )
    return root


def _key(vocab_size: int, n_toolcall: int, n_math: int, seed: int) -> str:
    spec = json.dumps(
        [_VERSION, vocab_size, n_toolcall, n_math, seed, SPECIAL_TOKENS, TAG_TOKENS, CHAT_TEMPLATE]
    )
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def build_tokenizer(
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    *,
    n_toolcall: int = 2000,
    n_math: int = 2000,
    seed: int = 0,
) -> Any:
    """Trains the tokenizer from scratch (about a second) and wraps it. No caching."""
    return wrap(train_bpe(corpus(n_toolcall, n_math, seed), vocab_size))


@functools.lru_cache(maxsize=4)
def _cached_json(vocab_size: int, n_toolcall: int, n_math: int, seed: int) -> str:
    path = os.path.join(
        cache_dir(), f"synthetic_bpe-{_key(vocab_size, n_toolcall, n_math, seed)}", "tokenizer.json"
    )
    # UTF-8 whatever the locale: the byte-level vocabulary is not ASCII (LC_ALL=C).
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    text = train_bpe(corpus(n_toolcall, n_math, seed), vocab_size).to_str()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)  # atomic: concurrent first uses never read half a file
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return text


def load_tokenizer(
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    *,
    n_toolcall: int = 2000,
    n_math: int = 2000,
    seed: int = 0,
) -> Any:
    """The synthetic_bpe tokenizer, trained once and cached as tokenizer.json under
    `$GDPO_JAX_CACHE` (default ~/.cache/gdpo_jax), keyed by the settings."""
    from tokenizers import Tokenizer

    return wrap(Tokenizer.from_str(_cached_json(vocab_size, n_toolcall, n_math, seed)))


def save_tokenizer(out_dir: str, **kw: Any) -> str:
    """Writes an HF tokenizer dir (tokenizer.json, tokenizer_config.json, ...)."""
    load_tokenizer(**kw).save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train / save the synthetic_bpe tokenizer.")
    ap.add_argument("--out_dir", required=True)
    ap.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE)
    a = ap.parse_args(argv)
    print(save_tokenizer(a.out_dir, vocab_size=a.vocab_size))


if __name__ == "__main__":
    main()
