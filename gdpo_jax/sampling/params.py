"""What a generate call takes and returns, host side: `SamplingParams` (validated,
hashable), `Rollouts` (the NumPy result), the finish codes and their names, the
decode program's layer / growth choices, and the prompt length buckets
(`bucket_length`, `default_prompt_buckets`) that bound how many prefill / decode
programs compile.

NumPy only, no flax: a config check reads these without importing the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

# A row's finish code, as the decode program writes it.
FINISH_LENGTH, FINISH_EOS, FINISH_STOP = 0, 1, 2
FINISH_NAMES = {FINISH_LENGTH: "length", FINISH_EOS: "eos", FINISH_STOP: "stop"}
# How the decode program runs the layers, and how a phase gets its cache slots
# (sampling.decode's docstring).
DECODE_LAYERS = ("scan", "unrolled", "fused")
DECODE_GROWTH = ("prefix", "copy")
DEFAULT_BUCKETS = (32, 64, 128, 256, 512, 1024, 2048)


# Below this, logits / temperature can overflow f32 (|logit| > 3.4e38 * T), and the
# max-subtracted logits become inf - inf = NaN: NaN log-probs and tokens that are not
# the argmax (from about T = 1e-38 with logits near 30).
MIN_TEMPERATURE = 1e-6


def _whole(name: str, value) -> int:
    """`value` as an int when it is a whole number (an int, or a float such as 64.0
    from a config); a ValueError naming the field otherwise."""
    whole = isinstance(value, (int, np.integer)) or (
        isinstance(value, (float, np.floating)) and float(value).is_integer()
    )
    if not whole or isinstance(value, (bool, np.bool_)):
        raise ValueError(f"SamplingParams.{name}={value!r} must be a whole number.")
    return int(value)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample. Changing temperature / top_p value does not recompile;
    max_new_tokens, top_k, greedy, and whether top-p is on (top_p < 1) do.

    max_new_tokens: completion width C (the output is always [N, C]).
    temperature: > 0; divides the logits (also for the log-probs when greedy).
    top_k: keep the k most likely tokens; 0 = off.
    top_p: nucleus mass in (0, 1]; 1.0 = off.
    greedy: argmax decoding (temperature / top-k / top-p ignored for the choice).
    stop_token_ids: extra ids that end a row with finish reason "stop".
    stop_strings: end a row with "stop" at the first occurrence in its text.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Lists from configs would make the params unhashable. int() truncated 37.7 to a
        # stop id 37 and took True as 1: each must be a whole number, and a token id.
        ids = self.stop_token_ids
        if isinstance(ids, (int, np.integer, float, str)):
            raise ValueError(
                f"SamplingParams.stop_token_ids={ids!r} must be a sequence of token ids, "
                f"e.g. ({ids!r},)."
            )
        ids = tuple(_whole(f"stop_token_ids[{i}]", t) for i, t in enumerate(ids))
        if any(t < 0 for t in ids):
            raise ValueError(f"SamplingParams.stop_token_ids={ids} must be token ids >= 0.")
        object.__setattr__(self, "stop_token_ids", ids)
        if isinstance(self.stop_strings, str):
            object.__setattr__(self, "stop_strings", (self.stop_strings,))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        # bool("false") is True: a string turned greedy decoding on.
        if not isinstance(self.greedy, (bool, np.bool_)):
            raise ValueError(f"SamplingParams.greedy={self.greedy!r} must be True or False.")
        # int() truncated 10.7 to 10 and took True as 1: a count must be a whole number.
        for name in ("max_new_tokens", "top_k"):
            object.__setattr__(self, name, _whole(name, getattr(self, name)))
        for name in ("temperature", "top_p"):  # '1' failed in a comparison naming nothing
            value = getattr(self, name)
            if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(
                value, (bool, np.bool_)
            ):
                raise ValueError(f"SamplingParams.{name}={value!r} must be a number.")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens={self.max_new_tokens} must be >= 1.")
        # inf passed: logits / inf is 0 everywhere, a uniform draw over the vocabulary.
        if not MIN_TEMPERATURE <= self.temperature < float("inf"):
            raise ValueError(
                f"SamplingParams.temperature={self.temperature} must be finite and >= "
                f"{MIN_TEMPERATURE:g} (use greedy=True for argmax decoding)."
            )
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k={self.top_k} must be >= 0 (0 disables it).")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(
                f"SamplingParams.top_p={self.top_p} must be in (0, 1] (1 disables it)."
            )
        for i, text in enumerate(self.stop_strings):
            if not isinstance(text, str):
                raise ValueError(
                    f"SamplingParams.stop_strings[{i}]={text!r} must be a str (stop ids go "
                    "in stop_token_ids)."
                )
            if not text:
                raise ValueError("SamplingParams.stop_strings must not contain empty strings.")


@dataclasses.dataclass
class Rollouts:
    """Host-side (NumPy) result of one generate call; N = len(prompts) * G rows.

    prompt_ids i32[N, P], prompt_mask i32[N, P]: left padded to the bucket P.
    completion_ids i32[N, C]: C = max_new_tokens, pad id after the end.
    completion_mask i32[N, C]: 1 up to and including the EOS / stop token.
    logprobs f32[N, C]: log_softmax(logits / T)[token] (tempered, before
      top-k/top-p), 0 where the mask is 0.
    lengths i32[N]: completion_mask.sum(1).
    finish_reason: "eos" | "stop" | "length" per row.
    group_ids, prompt_index i32[N]: r // G (the prompt a row answers).
    texts: decoded completions (special tokens skipped; a stop string is kept).
    info: timing and shape facts (seconds, prompt_bucket, decode_steps, ...).
    """

    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    completion_ids: np.ndarray
    completion_mask: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    finish_reason: list[str]
    group_ids: np.ndarray
    prompt_index: np.ndarray
    texts: list[str]
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.completion_ids.shape[0])


def bucket_length(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n; beyond the largest, the next multiple of it."""
    for b in buckets:
        if n <= b:
            return int(b)
    top = int(buckets[-1])
    return -(-n // top) * top


def default_prompt_buckets(max_len: int, *, count: int = 4, smallest: int = 16) -> tuple[int, ...]:
    """`count` widths halving down from `max_len` (none below `smallest`), ascending.

    2048 -> (256, 512, 1024, 2048); 128 -> (16, 32, 64, 128); 8 -> (8,).
    A prompt pays at most 2x its length or the smallest width, and a trainer
    compiles at most `count` step / decode programs for prompt widths.
    """
    out = [int(max_len)]
    while len(out) < count and out[-1] // 2 >= smallest:
        out.append(out[-1] // 2)
    return tuple(sorted(out))
