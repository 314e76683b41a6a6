"""Load Hugging Face checkpoints (and the offline SmolLM2 GGUF) into sharded params.

Weights are memory-mapped from the *.safetensors files and each device shard
is assembled from exactly the slices it needs (`jax.make_array_from_callback`),
so a model never passes whole through host->one-device memory.

    model, tok = load_pretrained("/ckpt/Qwen2.5-0.5B-Instruct", mesh=mesh)
    model, tok = load_pretrained("smollm2-135m-instruct")   # GGUF from PyPI
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Callable
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from numpy.typing import DTypeLike

from gdpo_jax.models.config import ModelConfig
from gdpo_jax.models.hf_names import LAYER_NAMES, TOP_NAMES
from gdpo_jax.models.sharding import abstract_model
from gdpo_jax.models.transformer import Transformer
from gdpo_jax.sharding import sanitize_spec

log = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def _safetensors_header(fp: str) -> tuple[dict[str, Any], int]:
    """(header, its byte length) of a safetensors file; a ValueError naming the file
    when it is cut short or corrupt (a truncated file read as "cannot reshape array of
    size 0 into shape (64,128)", a bad header as a bare JSONDecodeError)."""
    size = os.path.getsize(fp)
    with open(fp, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        raw = f.read(n) if 8 <= size and n <= size - 8 else b""
    try:
        header = json.loads(raw) if raw else None
        ends = [m["data_offsets"][1] for k, m in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        header, ends = None, []
    if header is None:
        raise ValueError(
            f"{fp}: not a readable safetensors file (its {size}-byte content has no valid "
            "header); it is truncated or corrupt: save or download it again."
        )
    need = 8 + n + max(ends, default=0)
    if need > size:
        raise ValueError(
            f"{fp}: truncated safetensors file (its header needs {need} bytes, the file has "
            f"{size}); save or download it again."
        )
    return header, n


class SafetensorsDir:
    """Memory-mapped view of every tensor in a checkpoint dir: name -> np array."""

    def __init__(self, path: str):
        index = os.path.join(path, "model.safetensors.index.json")
        single = os.path.join(path, "model.safetensors")
        if os.path.exists(index) and os.path.exists(single):
            # Which one holds the weights? Loaders differ (transformers takes
            # model.safetensors, others the index): one is a stale earlier save.
            raise ValueError(
                f"{path!r} holds both model.safetensors and model.safetensors.index.json "
                "(two saves in one dir?); remove the stale one."
            )
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            # Weight files by their names (model.safetensors, model-*-of-*.safetensors:
            # shards left beside it are a stale save, refused below); another
            # *.safetensors (a PEFT adapter_model.safetensors) was read as weights too
            # and refused the dir, which transformers loads.
            files = sorted(
                os.path.basename(p)
                for pattern in ("model.safetensors", "model-*-of-*.safetensors")
                for p in glob.glob(os.path.join(path, pattern))
            ) or sorted(  # other names: every file, as before
                os.path.basename(p) for p in glob.glob(os.path.join(path, "*.safetensors"))
            )
        if not files:
            raise FileNotFoundError(
                f"No *.safetensors files in {path!r} (PyTorch .bin "
                "checkpoints are not supported; re-save with safetensors)."
            )
        self.entries: dict[str, tuple[np.memmap, int, str, tuple[int, ...], int, str]] = {}
        for name in files:
            fp = os.path.join(path, name)
            header, n = _safetensors_header(fp)
            mm = np.memmap(fp, dtype=np.uint8, mode="r")
            for key, meta in header.items():
                if key == "__metadata__":
                    continue
                if key in self.entries:
                    raise ValueError(
                        f"Tensor {key!r} is in more than one file of {path!r} (the last: "
                        f"{name}); remove the stale weight files."
                    )
                lo, hi = meta["data_offsets"]
                self.entries[key] = (
                    mm,
                    8 + n + lo,
                    meta["dtype"],  # a code; looked up when read (an unknown one was a
                    tuple(meta["shape"]),  # bare KeyError here, even for a tensor not needed)
                    hi - lo,
                    name,
                )

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][3]

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def __getitem__(self, name: str) -> np.ndarray:
        mm, off, code, shape, nbytes, file = self.entries[name]
        if code not in _ST_DTYPES:
            # F8_E4M3 / F8_E5M2 checkpoints are quantized: their scales live in other
            # tensors, so the raw values are not the weights.
            raise ValueError(
                f"Tensor {name!r} in {file} is stored as {code}, which the loader does not "
                f"read (it reads {', '.join(_ST_DTYPES)}); convert the checkpoint to "
                "bf16 or f32 safetensors first."
            )
        return mm[off : off + nbytes].view(_ST_DTYPES[code]).reshape(shape)


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape that `cfg` needs."""
    shapes = _param_shapes(cfg)
    out = {}
    for ours, (hf, tr) in TOP_NAMES.items():
        if ours in shapes:
            out[hf] = shapes[ours][::-1] if tr else shapes[ours]
    for ours, (hf, tr) in LAYER_NAMES.items():
        if ours in shapes:
            s = shapes[ours][1:]
            for i in range(cfg.num_layers):
                out[hf.format(i=i)] = s[::-1] if tr else s
    return out


def _param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    abstract = abstract_model(cfg)
    return {
        str(path[-1]): tuple(v.get_value().shape)
        for path, v in nnx.to_flat_state(nnx.state(abstract))
    }


def _ignorable(name: str, cfg: ModelConfig) -> bool:
    """Tensors a checkpoint may hold that the model rightly does not use."""
    if name.endswith("rotary_emb.inv_freq"):  # a buffer older transformers saved
        return True
    # A tied model's copy of its embedding (checked equal in check_checkpoint).
    return name == "lm_head.weight" and cfg.tie_word_embeddings


def _same_tensor(reader: SafetensorsDir, a: str, b: str, rows: int = 4096) -> bool:
    """Whether two tensors hold the same values (compared a block of rows at a time)."""
    if reader.shape(a) != reader.shape(b):
        return False
    x, y = reader[a], reader[b]
    return all(np.array_equal(x[i : i + rows], y[i : i + rows]) for i in range(0, len(x), rows))


def check_checkpoint(reader: SafetensorsDir, cfg: ModelConfig, where: str) -> None:
    """Raise with the count of missing (or unused) tensors and the first 8 names, or
    the first mismatched one with both shapes.

    A tensor the config does not use (a bias, a q/k norm, an untied lm_head, an extra
    layer) means the config.json does not describe the weights: refused, not dropped.
    """
    want = expected_tensors(cfg)
    missing = [k for k in want if k not in reader]
    if missing:
        raise ValueError(
            f"Checkpoint {where!r} is missing {len(missing)} tensor(s) the config needs: "
            f"{missing[:8]}{' ...' if len(missing) > 8 else ''}"
        )
    unused = sorted(k for k in reader.entries if k not in want and not _ignorable(k, cfg))
    if unused:
        raise ValueError(
            f"Checkpoint {where!r} has {len(unused)} tensor(s) its config.json does not use "
            f"({cfg.model_type}, attention_bias={cfg.attention_bias}, qk_norm={cfg.qk_norm}, "
            f"tie_word_embeddings={cfg.tie_word_embeddings}, num_hidden_layers="
            f"{cfg.num_layers}): {unused[:8]}{' ...' if len(unused) > 8 else ''}"
        )
    if "lm_head.weight" in reader and cfg.tie_word_embeddings:
        # transformers 5 then uses this lm_head (4.x the embedding): only a copy is clear.
        if not _same_tensor(reader, "lm_head.weight", "model.embed_tokens.weight"):
            raise ValueError(
                f"Checkpoint {where!r} has tie_word_embeddings=true but an lm_head.weight "
                "that differs from model.embed_tokens.weight; set tie_word_embeddings "
                "false to use it, or remove it."
            )
    for name, shape in want.items():
        if reader.shape(name) != shape:
            raise ValueError(
                f"Tensor {name!r} in {where!r} has shape {reader.shape(name)} but the "
                f"config.json implies {shape}; the weights do not match the config."
            )


def build_model(
    cfg: ModelConfig,
    fetch: Callable[[str, bool], np.ndarray],
    *,
    mesh: jax.sharding.Mesh | None = None,
) -> Transformer:
    """Transformer whose params come from fetch(hf_name, transpose) -> host array.

    Each param is assembled per device shard straight from the source slices.
    """
    graphdef, state = nnx.split(abstract_model(cfg))
    dtype = np.dtype(jax.numpy.dtype(cfg.param_dtype))
    flat = []
    for path, var in nnx.to_flat_state(state):
        name, shape = str(path[-1]), tuple(var.get_value().shape)
        if mesh is None:
            sharding: jax.sharding.Sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        else:
            axes = var.get_metadata().get("out_sharding") or ()
            sharding = jax.NamedSharding(mesh, sanitize_spec(axes, shape, mesh))
        stacked = name in LAYER_NAMES
        hf, tr = LAYER_NAMES[name] if stacked else TOP_NAMES[name]
        memo: dict[str, np.ndarray] = {}

        def callback(idx, hf=hf, tr=tr, stacked=stacked, shape=shape, memo=memo):
            key = repr(idx)  # replicated shards ask for the same slice again
            if key not in memo:
                if stacked:
                    layers = range(shape[0])[idx[0]]
                    parts = [_view(fetch(hf.format(i=i), tr), idx[1:]) for i in layers]
                    memo[key] = np.stack(parts).astype(dtype)
                else:
                    memo[key] = _view(fetch(hf, tr), idx).astype(dtype)
            return memo[key]

        flat.append((path, var.replace(jax.make_array_from_callback(shape, sharding, callback))))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _view(a: np.ndarray, idx: tuple) -> np.ndarray:
    return np.ascontiguousarray(a[tuple(idx)])


def load_hf_dir(
    path: str,
    *,
    dtype: DTypeLike = "float32",
    param_dtype: DTypeLike = "float32",
    mesh: jax.sharding.Mesh | None = None,
    remat: bool = False,
    tokenizer: bool = True,
    attention: str = "auto",
    scan_layers: bool = True,
    remat_policy: str = "full",
) -> tuple[Transformer, Any]:
    """Load a local HF checkpoint dir (config.json + safetensors [+ tokenizer])."""
    if not os.path.exists(os.path.join(path, "config.json")):
        raise FileNotFoundError(
            f"{path!r} has no config.json; expected a Hugging Face checkpoint directory."
        )
    cfg = ModelConfig.from_hf(
        path,
        dtype=dtype,
        param_dtype=param_dtype,
        remat=remat,
        remat_policy=remat_policy,
        attention=attention,
        scan_layers=scan_layers,
    )
    reader = SafetensorsDir(path)
    check_checkpoint(reader, cfg, path)
    fetch = lambda name, tr: reader[name].T if tr else reader[name]  # noqa: E731
    model = build_model(cfg, fetch, mesh=mesh)
    return model, (load_tokenizer(path) if tokenizer else None)


def load_tokenizer(path: str) -> Any:
    """AutoTokenizer from a local dir, offline; None (with a warning) if absent."""
    from transformers import AutoTokenizer

    if not any(os.path.exists(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        # transformers 5 would build an empty tokenizer from the model_type alone.
        log.warning("No tokenizer files in %s; returning tokenizer=None.", path)
        return None
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - the files are there: their error is the answer
        # Returned as None, the run failed later with "came without a tokenizer (no
        # tokenizer.json ...)", the files being there and the parse error only a warning.
        raise ValueError(
            f"the tokenizer files in {path!r} do not load ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); save or download them again."
        ) from e
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token  # left-padded batches need a pad id
    return tok


def load_pretrained(
    path_or_name: str,
    *,
    dtype: DTypeLike = "float32",
    param_dtype: DTypeLike = "float32",
    mesh: jax.sharding.Mesh | None = None,
    remat: bool = False,
    attention: str = "auto",
    scan_layers: bool = True,
    remat_policy: str = "full",
) -> tuple[Transformer, Any]:
    """(model, tokenizer) from a local HF dir, a .gguf file, or a known offline name.

    Known names: see gguf.KNOWN_MODELS ("smollm2-135m-instruct"). dtype / param_dtype:
    "float32" / "bfloat16" / "float16" or the jnp / numpy dtype. EOS ids: config.json's
    plus those of generation_config.json (instruct models list their end-of-turn token there).
    """
    from gdpo_jax.models import gguf

    kw = dict(
        dtype=dtype,
        param_dtype=param_dtype,
        mesh=mesh,
        remat=remat,
        remat_policy=remat_policy,
        attention=attention,
        scan_layers=scan_layers,
    )
    key = path_or_name.lower()
    if key in gguf.KNOWN_MODELS or key.endswith(".gguf"):
        hf_dir = gguf.converted_hf_dir(path_or_name)
        return load_hf_dir(hf_dir, **kw)
    if os.path.isdir(path_or_name):
        return load_hf_dir(path_or_name, **kw)
    raise FileNotFoundError(
        f"{path_or_name!r} is neither a local checkpoint directory, a .gguf file, nor a "
        f"known offline model {sorted(gguf.KNOWN_MODELS)}. Hub ids are not downloaded; "
        "fetch the checkpoint first (e.g. `hf download <repo id> --local-dir <dir>`)."
    )


def save_pretrained(model: Transformer, tokenizer: Any, out_dir: str, **kw: Any) -> str:
    """See gdpo_jax.models.export.save_pretrained."""
    from gdpo_jax.models.export import save_pretrained as _save

    return _save(model, tokenizer, out_dir, **kw)
