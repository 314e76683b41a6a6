"""Export a Transformer to a Hugging Face directory transformers loads.

    save_pretrained(model, tokenizer, "out/policy-hf")
    AutoModelForCausalLM.from_pretrained("out/policy-hf")   # in PyTorch land

Writes config.json, generation_config.json, model.safetensors (split into
model-0000k-of-0000n.safetensors + index above `max_shard_bytes`) and the
tokenizer files. On multi-host runs every process must call it (the params are
gathered collectively); only process 0 writes.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_dtypes
import numpy as np

from gdpo_jax.models.hf_names import LAYER_NAMES, TOP_NAMES
from gdpo_jax.models.transformer import Transformer
from gdpo_jax.multihost import to_host as _to_host

_NP_TO_ST = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.float64): "F64",
}


def write_safetensors(
    tensors: dict[str, np.ndarray], path: str, metadata: dict[str, str] | None = None
) -> None:
    """Minimal safetensors writer (handles bf16 through ml_dtypes)."""
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
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())


def hf_state_dict(model: Transformer, dtype: str | None = None) -> dict[str, np.ndarray]:
    """HF-named host arrays (torch layout: Linear weights [out, in])."""
    cfg = model.cfg
    np_dtype = np.dtype(jax.numpy.dtype(dtype or cfg.param_dtype))
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
    """Write an HF checkpoint dir; dtype defaults to the params' dtype. Returns out_dir."""
    cfg = model.cfg
    tensors = hf_state_dict(model, dtype)
    if jax.process_index() != 0:
        return out_dir
    os.makedirs(out_dir, exist_ok=True)
    config = cfg.to_hf()
    config["torch_dtype"] = config["dtype"] = dtype or cfg.param_dtype
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    gen = {
        k: config[k]
        for k in ("bos_token_id", "eos_token_id", "pad_token_id")
        if config[k] is not None
    }
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, a in tensors.items():
        if size and size + a.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = a
        size += a.nbytes
    if len(shards) == 1:
        write_safetensors(shards[0], os.path.join(out_dir, "model.safetensors"))
    else:
        weight_map = {}
        for k, shard in enumerate(shards):
            fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(shard, os.path.join(out_dir, fname))
            weight_map.update({name: fname for name in shard})
        total = sum(a.nbytes for a in tensors.values())
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
