"""Llama-family decoder (Llama, SmolLM2, Qwen2/2.5, Qwen3) in Flax NNX, with
Hugging Face / GGUF weights in and Hugging Face weights out.

Every name loads its module on first use (PEP 562): a config check that reads
`gdpo_jax.models.config` then pays for neither flax nor optax (about 0.5 s of a CLI's
refusal), and `load_pretrained` imports transformers / gguf only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gdpo_jax.lazy_exports import lazy_exports

_LAZY = {
    "ModelConfig": "gdpo_jax.models.config",
    "KVCache": "gdpo_jax.models.kvcache",
    "Transformer": "gdpo_jax.models.transformer",
    "create_model": "gdpo_jax.models.sharding",
    "shard_model": "gdpo_jax.models.sharding",
    "get_param_shardings": "gdpo_jax.models.sharding",
    "get_param_specs": "gdpo_jax.models.sharding",
    "load_pretrained": "gdpo_jax.models.loading",
    "save_pretrained": "gdpo_jax.models.loading",
}

if TYPE_CHECKING:  # what type checkers and IDEs see (`as`: a re-export)
    from gdpo_jax.models.config import ModelConfig as ModelConfig
    from gdpo_jax.models.kvcache import KVCache as KVCache
    from gdpo_jax.models.loading import load_pretrained as load_pretrained
    from gdpo_jax.models.loading import save_pretrained as save_pretrained
    from gdpo_jax.models.sharding import create_model as create_model
    from gdpo_jax.models.sharding import get_param_shardings as get_param_shardings
    from gdpo_jax.models.sharding import get_param_specs as get_param_specs
    from gdpo_jax.models.sharding import shard_model as shard_model
    from gdpo_jax.models.transformer import Transformer as Transformer


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = list(_LAZY)
