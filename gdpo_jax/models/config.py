"""ModelConfig: one frozen, hashable description of a Llama-family decoder.

Covers the Hugging Face `config.json` layouts of Llama (and SmolLM2, which is a
Llama), Qwen2 / Qwen2.5 (q/k/v bias) and Qwen3 (q/k RMSNorm, explicit
head_dim). Hashable so it can be a static jit argument.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from gdpo_jax.models.generation_config import eos_ids as _eos_ids
from gdpo_jax.models.generation_config import (  # noqa: F401 - generation_eos_ids re-exported
    generation_defaults,
    generation_eos_ids,
    read_generation_config,
)
from gdpo_jax.models.rope_settings import (  # noqa: F401 - SUPPORTED_ROPE_TYPES re-exported
    SUPPORTED_ROPE_TYPES,
)
from gdpo_jax.models.rope_settings import check_rope_scaling as _check_rope_scaling
from gdpo_jax.models.rope_settings import context_length as _context_length
from gdpo_jax.models.rope_settings import rope_dict as _rope_dict

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
# model_type -> (attention_bias, qk_norm): what transformers' class of that type has.
ARCH_FLAGS = {"llama": (False, False), "qwen2": (True, False), "qwen3": (False, True)}
_DTYPES = ("float32", "bfloat16", "float16")

# transformers' defaults (LlamaConfig / Qwen2Config / Qwen3Config, 5.x) for the fields a
# config.json may leave out, where they differ from from_hf's generic ones (num_heads KV
# heads, hidden / heads per head, 2048 positions, no BOS / EOS). A Qwen2.5 config without
# max_position_embeddings was limited to 2048 tokens; a Llama one without eos_token_id
# sampled past EOS. tests/test_models.py compares against transformers' config classes.
_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"bos_token_id": 1, "eos_token_id": 2},
    "qwen2": {"num_key_value_heads": 32, "max_position_embeddings": 32768},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768},
}


def hf_max_positions(config: Mapping[str, Any]) -> int:
    """max_position_embeddings of a config.json dict as `ModelConfig.from_hf` reads it
    (its model type's default when left out), without checking the rest."""
    given = {**_TYPE_DEFAULTS.get(config.get("model_type"), {}), **config}
    return int(given.get("max_position_embeddings") or 2048)


ATTENTION_KINDS = ("auto", "xla", "dpa", "cudnn", "splash")
REMAT_POLICIES = ("full", "dots")  # ModelConfig.remat_policy
# The sizes that must be >= 1.
_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
)


def canonical_dtype(dtype: Any, field: str = "dtype") -> str:
    """A dtype as users write it ("bfloat16", jnp.bfloat16, np.float32, np.dtype) -> its name.

    The config stores the name so it stays hashable and JSON-friendly.
    """
    if isinstance(dtype, str) and dtype in _DTYPES:
        return dtype  # without ml_dtypes imported numpy does not know "bfloat16"
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
    import numpy as np

    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in _DTYPES:
        raise ValueError(
            f"{field}={dtype!r} is not a supported dtype; use one of {_DTYPES} "
            "(as a string, jnp.<name> or np.dtype)."
        )
    return name


def _freeze(x: Any) -> Any:
    """dict/list -> sorted tuples so the config stays hashable."""
    if isinstance(x, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    return x


def hf_rope(c: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """(rope_theta, rope scaling dict; {} for default RoPE) of a config.json dict, as
    transformers reads it. One-line ValueError for settings this model cannot run."""
    # transformers >= 5 stores rope settings in `rope_parameters`; older
    # configs have `rope_theta` + `rope_scaling`.
    rope = _rope_dict(c.get("rope_parameters"))
    rope_theta = float(rope.pop("rope_theta", c.get("rope_theta", 10000.0)))
    if c.get("rope_scaling"):
        legacy = _rope_dict(c["rope_scaling"])
        legacy.pop("rope_theta", None)
        if c.get("rope_parameters") and legacy != rope:
            # transformers then takes rope_scaling alone (and theta 10000 unless
            # set at the top level); merging them silently gave other frequencies.
            raise ValueError(
                f"config.json has rope_parameters={c['rope_parameters']} and a "
                f"rope_scaling={c['rope_scaling']} that disagrees with it; keep one "
                "(transformers >= 5 reads rope_parameters) and remove the other."
            )
        rope.update(legacy)
    # transformers >= 5 may keep it in the rope dict; Llama / Qwen rotate the whole
    # head, and a partial rotation would silently be another model.
    partial = rope.pop("partial_rotary_factor", c.get("partial_rotary_factor"))
    if partial is not None and float(partial) != 1.0:
        raise ValueError(
            f"partial_rotary_factor={partial} is not supported: this model rotates every "
            "head dimension (remove it, or set it to 1.0, for a Llama / Qwen checkpoint)."
        )
    if rope.get("rope_type", "default") == "default":
        rope = {}
    elif rope["rope_type"] in ("llama3", "yarn") and c.get("original_max_position_embeddings"):
        # Top level (Phi3-style): transformers prefers it to the rope dict's.
        rope["original_max_position_embeddings"] = c["original_max_position_embeddings"]
    return rope_theta, rope


def hf_context_length(config: Mapping[str, Any]) -> int:
    """`ModelConfig.context_length` of a config.json dict, without checking the rest."""
    rope = hf_rope(config)[1]  # no rope field has a model-type default
    _check_rope_scaling(rope)
    return _context_length(hf_max_positions(config), rope)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture + dtype policy of a decoder-only transformer.

    rope_scaling: None (plain RoPE) or a sorted tuple of (key, value) pairs of
      the HF rope dict without `rope_theta`, e.g. (("factor", 8.0), ...,
      ("rope_type", "llama3")). Use `rope_scaling_dict()` to read it.
    param_dtype: storage dtype of the parameters; dtype: compute dtype of
      activations. Logits are always float32.
    remat: rematerialize each layer in the backward pass (jax.checkpoint).
    remat_policy: what a rematerialized layer keeps for its backward (read with
      remat): "full" its input alone (the backward re-runs the layer's forward,
      but the down projection, which it never reads); "dots" also its weight
      products' outputs (it re-runs norms, RoPE, attention and gating): memory
      between "full" and no remat (which keeps every intermediate).
    scan_layers: run the layers as one `jax.lax.scan` (True: one layer
      compiled, whatever L) or unrolled (False: L layers compiled, and no
      stacking of per-layer activations into [L, ...] buffers, which slows
      few-layer steps on XLA:CPU: profile_step's A/B in docs/benchmarks.md).
      Same maths. Decode steps follow `sampling.decode_layers` instead.
    attention: kernel of multi-token attention (training forward, prefill):
      "auto" (cuDNN flash attention on GPU in bf16/f16, splash on TPU, else
      "xla"), "xla" (the grouped einsum path), "dpa" (jax.nn.dot_product_attention,
      XLA kernel), "cudnn" (jax.nn.dot_product_attention, cuDNN; GPU, bf16/f16
      only) or "splash" (the Pallas TPU splash kernel; training, log-prob and
      fresh-cache prefill forwards). One-token decode steps always use the
      einsum path.
    attention_bias / qk_norm: None (the default) follows model_type, as the Hugging
      Face class of that type has them: q/k/v bias for qwen2, q/k RMSNorm for qwen3,
      neither for llama. Set explicitly, another mix builds and runs, but `to_hf`
      (hence export) refuses it: no Hugging Face class describes it.
    """

    model_type: str = "llama"
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool | None = None
    qk_norm: bool | None = None
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: bool = False
    remat_policy: str = "full"
    attention: str = "auto"
    scan_layers: bool = True
    # generation_config.json's sampling defaults, ((name, value), ...): written back on
    # export (`models.generation_config`), read by nothing here.
    generation_defaults: tuple = ()

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(
                f"attention={self.attention!r} is not one of {ATTENTION_KINDS}; "
                "set config.model.attention to one of them."
            )
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(
                f"remat_policy={self.remat_policy!r} is not one of {REMAT_POLICIES}; "
                "set config.model.remat_policy to one of them."
            )
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type={self.model_type!r} is not supported; supported: "
                f"{SUPPORTED_MODEL_TYPES} (SmolLM2 is 'llama', Qwen2.5 is 'qwen2')."
            )
        for field in ("param_dtype", "dtype"):
            object.__setattr__(self, field, canonical_dtype(getattr(self, field), field))
        for field, default in zip(
            ("attention_bias", "qk_norm"), ARCH_FLAGS[self.model_type], strict=True
        ):
            value = getattr(self, field)
            object.__setattr__(self, field, default if value is None else bool(value))
        for field in _SIZES:  # a zero size built, then failed inside a trace or a save
            if int(getattr(self, field)) < 1:
                raise ValueError(f"{field}={getattr(self, field)} must be >= 1.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of "
                f"num_kv_heads={self.num_kv_heads}."
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE.")
        if self.rope_scaling:
            # The legacy "type" key, read as from_hf reads it: built directly (tiny
            # configs, from_hf's overrides) it was unread, so a linear or unsupported
            # dynamic scaling ran as plain RoPE.
            rope = _rope_dict(dict(self.rope_scaling))
            object.__setattr__(self, "rope_scaling", _freeze(rope))
        _check_rope_scaling(self.rope_scaling_dict())
        # Lists from JSON would make the frozen config unhashable.
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if isinstance(self.rope_scaling, (dict, list)):
            object.__setattr__(self, "rope_scaling", _freeze(self.rope_scaling))

    # ------------------------------------------------------------------ helpers
    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """eos_token_id as a tuple (empty when unset)."""
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.rope_scaling) if self.rope_scaling else {}

    @property
    def context_length(self) -> int:
        """Positions this model serves: max_position_embeddings, stretched by linear or
        yarn rope scaling (`rope_settings.context_length`)."""
        return _context_length(self.max_position_embeddings, self.rope_scaling_dict())

    def replace(self, **overrides: Any) -> ModelConfig:
        return dataclasses.replace(self, **overrides)

    def num_params(self) -> int:
        """Parameter count (embeddings included once when tied)."""
        d, f, dh = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_heads * dh, self.num_kv_heads * dh
        layer = d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d
        if self.attention_bias:
            layer += q + 2 * kv
        if self.qk_norm:
            layer += 2 * dh
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + d

    def flops_per_token(self, seq_len: int, *, training: bool = True) -> float:
        """Model FLOPs per token, PaLM-appendix convention (MFU numerator).

        forward = 2 * (matmul params, unembedding included) + 4 * L * Hq * Dh * T
        (QK^T and AV, causal mask not discounted); training = 3 * forward.
        """
        d, f, dh = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_heads * dh, self.num_kv_heads * dh
        dense = self.num_layers * (d * (q + 2 * kv) + q * d + 3 * d * f) + d * self.vocab_size
        fwd = 2.0 * dense + 4.0 * self.num_layers * q * seq_len
        return 3.0 * fwd if training else fwd

    def check_hf_architecture(self) -> None:
        """Raise unless attention_bias / qk_norm are what model_type's HF class has."""
        want = ARCH_FLAGS[self.model_type]
        if (self.attention_bias, self.qk_norm) != want:
            raise ValueError(
                f"model_type={self.model_type!r} with attention_bias={self.attention_bias}, "
                f"qk_norm={self.qk_norm} has no Hugging Face equivalent ({self.model_type} has "
                f"attention_bias={want[0]}, qk_norm={want[1]}); leave both unset to follow "
                "model_type."
            )

    @classmethod
    def tiny(cls, **overrides: Any) -> ModelConfig:
        """A ~100k-parameter Llama for tests (GQA 4:2, untied); attention_bias and
        qk_norm follow model_type unless overridden."""
        base = dict(
            model_type="llama",
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=512,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        base.update(overrides)
        return cls(**base)

    # ------------------------------------------------------------------ HF i/o
    @classmethod
    def from_hf(
        cls, config: Mapping[str, Any] | str | os.PathLike, **overrides: Any
    ) -> ModelConfig:
        """Build from a HF config dict, a config.json path, or a checkpoint dir.

        overrides: e.g. param_dtype="bfloat16", dtype="bfloat16", remat=True.
        """
        gen: dict[str, Any] = {}
        if not isinstance(config, Mapping):
            path = os.fspath(config)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            with open(path) as f:
                config = json.load(f)
            gen = read_generation_config(os.path.dirname(path))
        gen_eos = _eos_ids(gen.get("eos_token_id"))
        c = dict(config)
        model_type = c.get("model_type")
        # A field config.json leaves out takes transformers' default for the model type.
        c = {**_TYPE_DEFAULTS.get(model_type, {}), **c}
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"Unsupported model_type={model_type!r} in config.json; supported: "
                f"{SUPPORTED_MODEL_TYPES} (Llama, SmolLM2, Qwen2, Qwen2.5, Qwen3)."
            )
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={c['hidden_act']!r}: only 'silu' (SwiGLU) is supported.")
        if c.get("mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported (no Llama/Qwen release uses it).")
        if c.get("use_sliding_window", False):
            raise ValueError(
                "use_sliding_window=True is not supported; set it false "
                "(full attention) or use a checkpoint without sliding window."
            )
        # q/k/v bias: transformers' Qwen2 always has it, whatever the config says.
        attention_bias = model_type == "qwen2" or bool(c.get("attention_bias", False))
        if attention_bias and model_type != "qwen2":
            raise ValueError(
                f"attention_bias=True for model_type={model_type!r} also adds an o_proj "
                "bias in transformers, which this implementation does not carry."
            )
        rope_theta, rope = hf_rope(c)
        num_heads = int(c["num_attention_heads"])
        head_dim = c.get("head_dim") or c["hidden_size"] // num_heads
        # config.json's EOS first, then any further ones from generation_config.json.
        eos_ids = _eos_ids(c.get("eos_token_id"))
        eos_ids += tuple(i for i in gen_eos if i not in eos_ids)
        eos = eos_ids[0] if len(eos_ids) == 1 else (eos_ids or None)
        kw = dict(
            model_type=model_type,
            vocab_size=int(c["vocab_size"]),
            hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]),
            num_layers=int(c["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(c.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rope_theta=rope_theta,
            rope_scaling=_freeze(rope) if rope else None,
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            qk_norm=model_type == "qwen3",
            max_position_embeddings=hf_max_positions(c),
            # config.json's, else generation_config.json's (Qwen2.5-Instruct keeps its pad
            # id only there: an export dropped it).
            bos_token_id=_first(c.get("bos_token_id"), gen.get("bos_token_id")),
            eos_token_id=eos,
            pad_token_id=_first(c.get("pad_token_id"), gen.get("pad_token_id")),
            generation_defaults=generation_defaults(gen),
        )
        kw.update(overrides)
        return cls(**kw)

    def to_hf(self) -> dict[str, Any]:
        """config.json content that transformers' AutoConfig reads back.

        Raises ValueError when attention_bias / qk_norm differ from model_type's
        (`check_hf_architecture`): no config.json describes such a model.
        """
        self.check_hf_architecture()
        arch = {
            "llama": "LlamaForCausalLM",
            "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
        }[self.model_type]
        rope = {"rope_theta": self.rope_theta, "rope_type": "default"}
        rope.update(self.rope_scaling_dict())
        eos = self.eos_token_id
        out: dict[str, Any] = {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(eos) if isinstance(eos, tuple) else eos,
            "pad_token_id": self.pad_token_id,
            # Both spellings: transformers 5 reads rope_parameters, 4.x reads
            # rope_theta/rope_scaling.
            "rope_parameters": rope,
            "rope_theta": self.rope_theta,
            "rope_scaling": (self.rope_scaling_dict() or None),
            "torch_dtype": self.param_dtype,
            "use_cache": True,
        }
        if self.model_type == "llama":
            out["attention_bias"] = False
            out["mlp_bias"] = False
        if self.model_type == "qwen3":
            out["attention_bias"] = False
        if self.model_type in ("qwen2", "qwen3"):
            out["use_sliding_window"] = False
            out["sliding_window"] = None
        return out


def _first(*values: Any) -> Any:
    """The first value that is not None (None if all are)."""
    return next((v for v in values if v is not None), None)
