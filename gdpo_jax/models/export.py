"""Export a Transformer to a Hugging Face directory transformers loads.

    save_pretrained(model, tokenizer, "out/policy-hf")
    AutoModelForCausalLM.from_pretrained("out/policy-hf")   # in PyTorch land

Writes config.json, generation_config.json, model.safetensors (split into
model-0000k-of-0000n.safetensors + index above `max_shard_bytes`) and the
tokenizer files. Weight and tokenizer files of an earlier export in the same dir are
removed first, so the dir never holds both weight layouts or another tokenizer.
config.json is removed first and written last: a dir holding it is complete. On
multi-host runs every process must call it (the params are gathered collectively); only
process 0 writes, and every process returns once the dir is complete.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Any

import jax
import ml_dtypes
import numpy as np

from gdpo_jax.models.generation_config import IDS, generation_json
from gdpo_jax.models.hf_names import LAYER_NAMES, TOP_NAMES
from gdpo_jax.models.transformer import Transformer
from gdpo_jax.multihost import allgather
from gdpo_jax.multihost import to_host as _to_host

_NP_TO_ST = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.float64): "F64",
}

log = logging.getLogger(__name__)


def write_safetensors(
    tensors: dict[str, np.ndarray], path: str, metadata: dict[str, str] | None = None
) -> None:
    """Minimal safetensors writer (handles bf16 through ml_dtypes); the file appears
    whole (written beside it, then renamed)."""
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, a in tensors.items():
        header[name] = {
            "dtype": _NP_TO_ST[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # 8-byte aligned data start, as the spec advises
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())
    os.replace(tmp, path)


def _write_json(obj: Any, path: str) -> None:
    """json.dump to `path` atomically: a failed write leaves the old file (or none)."""
    text = json.dumps(obj, indent=2)  # raises before any file is touched
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def export_dtype(dtype: Any) -> np.dtype:
    """A dtype as users write it ("bfloat16", jnp.bfloat16, np.dtype) -> a numpy dtype
    safetensors can store."""
    try:
        dt = np.dtype(dtype)  # knows "bfloat16": ml_dtypes is imported above
    except TypeError:
        dt = None
    # float64 writes, but no loader here reads it back (nor is it a model dtype).
    if dt not in _NP_TO_ST or dt == np.float64:
        names = sorted(d.name for d in _NP_TO_ST if d != np.float64)
        raise ValueError(f"dtype={dtype!r} is not a supported export dtype; use one of {names}.")
    return dt


# What tokenizer.save_pretrained writes, fast or slow, with or without a chat template.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


def _tokenizer_files(path: str) -> list[str]:
    """An earlier export's tokenizer files in a dir."""
    return [n for n in _TOKENIZER_FILES if os.path.exists(os.path.join(path, n))]


def _weight_files(path: str) -> list[str]:
    """The HF weight files in a dir: model.safetensors, its sharded form and index."""
    names = ["model.safetensors", "model.safetensors.index.json"]
    found = [n for n in names if os.path.exists(os.path.join(path, n))]
    shards = glob.glob(os.path.join(glob.escape(path), "model-*-of-*.safetensors"))
    return found + sorted(os.path.basename(p) for p in shards)


def hf_state_dict(model: Transformer, dtype: str | None = None) -> dict[str, np.ndarray]:
    """HF-named host arrays (torch layout: Linear weights [out, in])."""
    cfg = model.cfg
    np_dtype = export_dtype(dtype or cfg.param_dtype)
    params = model.param_arrays()
    out: dict[str, np.ndarray] = {}
    for ours, (hf, tr) in TOP_NAMES.items():
        if ours in params:
            a = _to_host(params[ours])
            out[hf] = (a.T if tr else a).astype(np_dtype)
    for ours, (hf, tr) in LAYER_NAMES.items():
        if ours in params["layers"]:
            a = _to_host(params["layers"][ours])
            for i in range(cfg.num_layers):
                out[hf.format(i=i)] = np.ascontiguousarray(a[i].T if tr else a[i]).astype(np_dtype)
    return out


def save_pretrained(
    model: Transformer,
    tokenizer: Any,
    out_dir: str,
    *,
    dtype: str | None = None,
    max_shard_bytes: int = 4 << 30,
) -> str:
    """Write an HF checkpoint dir; dtype defaults to the params' dtype. Returns out_dir.

    dtype: "float32" / "bfloat16" / "float16" or the jnp / numpy dtype. Weight files
    of an earlier export in out_dir (model.safetensors, model-*-of-*.safetensors and
    the index) and its tokenizer files are removed before the new ones are written.
    """
    whole = isinstance(max_shard_bytes, int) and not isinstance(max_shard_bytes, bool)
    if not whole or max_shard_bytes < 1:
        # 0 wrote one tensor per file; None or "2GB" (transformers' max_shard_size form)
        # failed comparing an int with it.
        raise ValueError(
            f"max_shard_bytes={max_shard_bytes!r} must be a positive int (bytes per weight "
            "file), e.g. 4 << 30."
        )
    cfg = model.cfg
    dtype = export_dtype(dtype or cfg.param_dtype).name
    config = cfg.to_hf()  # refuses a model no config.json describes, before any work
    config["torch_dtype"] = config["dtype"] = dtype
    tensors = hf_state_dict(model, dtype)
    error: Exception | None = None
    if jax.process_index() == 0:
        try:
            gen = generation_json(cfg.generation_defaults, {k: config[k] for k in IDS})
            _write_dir(out_dir, config, tensors, tokenizer, max_shard_bytes, gen)
        except Exception as e:  # the others learn of it below instead of waiting
            error = e
    if jax.process_count() > 1:
        # A barrier that carries process 0's outcome: every process returns only once
        # the dir is complete (the SFT warm start hands it to the RL run as model.name;
        # the other hosts returned at once and could read a missing or half-written
        # dir), and all of them raise when process 0 failed.
        if not allgather(np.asarray(error is None)).all() and error is None:
            raise RuntimeError(f"process 0 failed to export to {out_dir}; see its log.")
    if error is not None:
        raise error
    return out_dir


def _write_dir(
    out_dir: str,
    config: dict,
    tensors: dict[str, np.ndarray],
    tokenizer: Any,
    max_shard_bytes: int,
    gen: dict,
) -> None:
    """save_pretrained's writes (process 0's); `gen`: generation_config.json's content
    (the ids, and the sampling defaults the loaded checkpoint shipped)."""
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, a in tensors.items():
        if size and size + a.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = a
        size += a.nbytes
    if len(shards) == 1:
        files = {"model.safetensors": shards[0]}
        index = None
    else:
        files = {
            f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors": shard
            for k, shard in enumerate(shards)
        }
        weight_map = {name: fname for fname, shard in files.items() for name in shard}
        total = sum(a.nbytes for a in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    json.dumps([config, gen, index])  # all serializable, checked before out_dir is touched
    os.makedirs(out_dir, exist_ok=True)
    # config.json marks a complete directory (a warm start skips its SFT when it exists):
    # an earlier export's goes first, and this one's is written last, after the tokenizer.
    done = os.path.join(out_dir, "config.json")
    if os.path.exists(done):
        os.remove(done)
    # An earlier export's files would be read instead of (or beside) the new ones:
    # an index wins over model.safetensors in our loader, the reverse in transformers.
    for name in _weight_files(out_dir):
        os.remove(os.path.join(out_dir, name))
    # So are its tokenizer files: with tokenizer=None they stayed beside the new weights
    # (another vocabulary, read as this model's), and a new tokenizer of another kind
    # (sentencepiece after BPE) left the old kind's files to be picked up instead.
    stale = _tokenizer_files(out_dir)
    for name in stale:
        os.remove(os.path.join(out_dir, name))
    if stale and tokenizer is None:
        log.warning(
            "removed an earlier export's tokenizer files from %s (%s); this export has none",
            out_dir,
            ", ".join(stale),
        )
    for fname, shard in files.items():
        write_safetensors(shard, os.path.join(out_dir, fname))
    if index is not None:
        _write_json(index, os.path.join(out_dir, "model.safetensors.index.json"))
    _write_json(gen, os.path.join(out_dir, "generation_config.json"))
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    _write_json(config, done)  # last: the dir is complete
