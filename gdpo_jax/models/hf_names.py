"""Parameter names: ours -> Hugging Face Llama-family tensor names.

A leaf module (no imports from the package), shared by `loading.py` (HF ->
ours) and `export.py` (ours -> HF), so neither needs the other.
"""

from __future__ import annotations

__all__ = ["LAYER_NAMES", "TOP_NAMES"]

# our param -> (HF tensor name, stored transposed relative to ours)
TOP_NAMES: dict[str, tuple[str, bool]] = {
    "embed": ("model.embed_tokens.weight", False),
    "final_norm": ("model.norm.weight", False),
    "lm_head": ("lm_head.weight", True),
}
LAYER_NAMES: dict[str, tuple[str, bool]] = {
    "attn_norm": ("model.layers.{i}.input_layernorm.weight", False),
    "q_proj": ("model.layers.{i}.self_attn.q_proj.weight", True),
    "k_proj": ("model.layers.{i}.self_attn.k_proj.weight", True),
    "v_proj": ("model.layers.{i}.self_attn.v_proj.weight", True),
    "o_proj": ("model.layers.{i}.self_attn.o_proj.weight", True),
    "q_bias": ("model.layers.{i}.self_attn.q_proj.bias", False),
    "k_bias": ("model.layers.{i}.self_attn.k_proj.bias", False),
    "v_bias": ("model.layers.{i}.self_attn.v_proj.bias", False),
    "q_norm": ("model.layers.{i}.self_attn.q_norm.weight", False),
    "k_norm": ("model.layers.{i}.self_attn.k_norm.weight", False),
    "mlp_norm": ("model.layers.{i}.post_attention_layernorm.weight", False),
    "gate_proj": ("model.layers.{i}.mlp.gate_proj.weight", True),
    "up_proj": ("model.layers.{i}.mlp.up_proj.weight", True),
    "down_proj": ("model.layers.{i}.mlp.down_proj.weight", True),
}
