"""generation_config.json: the stop ids and sampling defaults a checkpoint ships beside
its config.json (Qwen2.5 / Qwen3-Instruct keep their end-of-turn id, pad id and
recommended temperature / top_p / top_k there), read on load and written back on export.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
# transformers' bookkeeping, rewritten by whoever saves the file.
_SKIP = ("transformers_version", "_from_model_config")
_SCALAR = (str, int, float, bool, type(None))


def read_generation_config(checkpoint_dir: str) -> dict[str, Any]:
    """`<checkpoint_dir>/generation_config.json` as a dict ({} if absent); a ValueError
    naming the file when it does not read."""
    path = os.path.join(checkpoint_dir, "generation_config.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            gen = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}; fix or remove the file") from e
    if not isinstance(gen, dict):
        raise ValueError(f"{path} holds {type(gen).__name__}, not a JSON object; fix or remove it")
    return gen


def eos_ids(value: Any) -> tuple[int, ...]:
    """An eos_token_id field (an int, a list, or None) as a tuple of ints."""
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


def generation_eos_ids(checkpoint_dir: str) -> tuple[int, ...]:
    """EOS ids listed in `<checkpoint_dir>/generation_config.json` (empty if absent).

    Instruct checkpoints (Qwen2.5 / Qwen3) list the end-of-turn token there as well
    as the base EOS; config.json has only one, and a rollout that emits the other
    would otherwise run on to the length cap.
    """
    return eos_ids(read_generation_config(checkpoint_dir).get("eos_token_id"))


def generation_defaults(gen: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The sampling defaults of a generation_config dict (not its ids or transformers'
    bookkeeping), hashable for ModelConfig: JSON scalars and lists of them (as tuples),
    sorted by name. Nested objects are left out."""
    out = []
    for k, v in gen.items():
        if k in IDS or k in _SKIP:
            continue
        if isinstance(v, list) and all(isinstance(x, _SCALAR) for x in v):
            out.append((k, tuple(v)))
        elif isinstance(v, _SCALAR):
            out.append((k, v))
    return tuple(sorted(out))


def generation_json(defaults: tuple[tuple[str, Any], ...], ids: Mapping[str, Any]) -> dict:
    """generation_config.json's content: the defaults (tuples as lists), then the ids."""
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in defaults}
    out.update({k: v for k, v in ids.items() if v is not None})
    return out
