"""The model architecture a config describes, read from names, never from weights."""

from __future__ import annotations

import os
from typing import Any

import ml_collections as mlc

from gdpo_jax.models.config import ModelConfig


class PlanError(ValueError):
    """The config cannot be planned (names the field and the fix)."""


# --------------------------------------------------------------------------- #
# The architecture, without a checkpoint.
# --------------------------------------------------------------------------- #
def paper_models() -> dict[str, Any]:
    try:
        from configs import paper_common
    except ImportError:  # run from outside the repository root
        return {}
    return dict(paper_common.MODELS)


def model_config(cfg: mlc.ConfigDict) -> ModelConfig:
    """The ModelConfig a run of `cfg` would build, read from names, not weights.

    config.model.name: a paper variant ("r1-distill-7b") or its hub id, a local
    checkpoint dir (only config.json is read), or "" (random init; model.tiny).
    """
    m = cfg.model
    kw = dict(
        dtype=m.dtype,
        param_dtype=m.param_dtype,
        remat=bool(m.remat),
        remat_policy=str(m.get("remat_policy", "full")),
        attention=str(m.get("attention", "auto")),
        scan_layers=bool(m.get("scan_layers", True)),
    )
    models = paper_models()
    spec = models.get(m.name) or next((s for s in models.values() if s.hf_id == m.name), None)
    if spec is not None:
        return ModelConfig(
            model_type=spec.model_type,
            vocab_size=spec.vocab_size,
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_layers=spec.num_layers,
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            rope_theta=spec.rope_theta,
            tie_word_embeddings=spec.tie_word_embeddings,
            attention_bias=spec.model_type == "qwen2",
            qk_norm=spec.model_type == "qwen3",
            max_position_embeddings=spec.max_position_embeddings,
            eos_token_id=0,
            pad_token_id=0,
            **kw,
        )
    if m.name and os.path.exists(os.path.join(m.name, "config.json")):
        try:
            return ModelConfig.from_hf(m.name, **kw)
        except ValueError as e:  # an unsupported model_type or broken JSON: one line
            raise PlanError(f"config.model.name={m.name!r}: {e}") from None
    if m.name:
        raise PlanError(
            f"config.model.name={m.name!r} is neither a checkpoint dir with a config.json nor a "
            f"paper variant; the planner needs only the architecture: pass "
            f"--config.model.name=<one of {sorted(models)}> (or a dir holding config.json)."
        )
    tiny = dict(m.tiny.to_dict())
    if "vocab_size" not in tiny:
        from gdpo_jax.train.build import build_tokenizer

        tiny["vocab_size"] = len(build_tokenizer(m.tokenizer))
    return ModelConfig.tiny(**kw, **tiny)
