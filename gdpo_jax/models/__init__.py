"""Llama-family decoder (Llama, SmolLM2, Qwen2/2.5, Qwen3) in Flax NNX, with
Hugging Face / GGUF weights in and Hugging Face weights out."""

from gdpo_jax.models.config import ModelConfig
from gdpo_jax.models.kvcache import KVCache
from gdpo_jax.models.sharding import create_model, get_param_shardings, get_param_specs, shard_model
from gdpo_jax.models.transformer import Transformer


def __getattr__(name: str):
    # Loading's functions import transformers / gguf when called: import it only when asked.
    if name in ("load_pretrained", "save_pretrained"):
        from gdpo_jax.models import loading

        return getattr(loading, name)
    raise AttributeError(name)


__all__ = [
    "ModelConfig",
    "Transformer",
    "KVCache",
    "create_model",
    "shard_model",
    "get_param_shardings",
    "get_param_specs",
    "load_pretrained",
    "save_pretrained",
]
