"""A rope_scaling dict, as config.json / transformers spell it: the legacy "type" key
read as "rope_type", and the keys each supported type needs checked when a ModelConfig is
built (one line naming the key, not a KeyError in the forward)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SUPPORTED_ROPE_TYPES", "check_rope_scaling", "context_length", "rope_dict"]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# rope_type -> the keys it needs, as transformers' rope validation (which fills a
# missing original_max_position_embeddings of llama3 / yarn with max_position_embeddings).
_ROPE_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "yarn": ("factor",),
}


def rope_dict(value: Any) -> dict:
    """A rope settings dict with the legacy "type" key read as "rope_type"."""
    rope = dict(value or {})
    if "type" in rope:
        kind = rope.pop("type")
        rope.setdefault("rope_type", kind)
    return rope


def check_rope_scaling(rope: Mapping[str, Any]) -> None:
    """One-line ValueError for an unsupported rope_type or a missing / non-numeric key."""
    rope_type = rope.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling rope_type={rope_type!r} is not supported; supported: "
            f"{SUPPORTED_ROPE_TYPES}."
        )
    need = _ROPE_KEYS.get(rope_type, ())
    missing = [k for k in need if rope.get(k) is None]
    if missing:
        raise ValueError(f"rope_scaling rope_type={rope_type!r} needs {missing}; got {dict(rope)}.")
    for k in [k for k in (*need, "original_max_position_embeddings") if k in rope]:
        v = rope[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError(
                f"rope_scaling {k}={v!r} (rope_type={rope_type!r}) must be a number > 0."
            )
    if rope_type == "llama3" and rope["high_freq_factor"] <= rope["low_freq_factor"]:
        raise ValueError(
            f"rope_scaling high_freq_factor={rope['high_freq_factor']} must exceed "
            f"low_freq_factor={rope['low_freq_factor']} (llama3 divides by their difference)."
        )


def context_length(max_position_embeddings: int, rope: Mapping[str, Any]) -> int:
    """Positions a model with these rope settings serves, as vLLM derives its max_model_len.

    linear stretches the trained positions by `factor`; yarn serves
    `factor x original_max_position_embeddings` (Qwen2.5 keeps
    max_position_embeddings=32768 with yarn factor 4 for a 131072 context); llama3's
    max_position_embeddings is already the extended one (Llama 3.1: 131072).
    """
    rope_type = rope.get("rope_type", "default")
    if rope_type == "linear":
        return int(max_position_embeddings * rope["factor"])
    if rope_type == "yarn":
        trained = rope.get("original_max_position_embeddings", max_position_embeddings)
        return max(max_position_embeddings, int(trained * rope["factor"]))
    return int(max_position_embeddings)
