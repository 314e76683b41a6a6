"""From a config to live objects: the model (born sharded) and its tokenizer.

Tasks and tokenizers are looked up by name in their own registries, below the
trainer: `gdpo_jax.tasks` (`register_task`, `load_task`, `TaskData`) and
`gdpo_jax.data.tokenizer_registry` (`register_tokenizer`, `build_tokenizer`).
Their names are re-exported here so `gdpo_jax.train.build.register_task` & co.
keep working.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from gdpo_jax.data.tokenizer_registry import (
    _TOKENIZERS,
    build_tokenizer,
    register_tokenizer,
    tokenizer_known,
)
from gdpo_jax.errors import ConfigError
from gdpo_jax.tasks import TaskData, TaskLoader, list_tasks, load_task, register_task

__all__ = [
    "TaskData",
    "TaskLoader",
    "_TOKENIZERS",
    "build_model",
    "build_tokenizer",
    "list_tasks",
    "load_task",
    "process_info",
    "register_task",
    "register_tokenizer",
    "tokenizer_known",
]


def build_model(cfg, mesh: Mesh | None) -> tuple[Any, Any]:
    """(Transformer born sharded on `mesh`, tokenizer) from config.model."""
    from gdpo_jax.models import ModelConfig
    from gdpo_jax.models.sharding import create_model

    m = cfg.model
    if m.name:
        from gdpo_jax.models import load_pretrained

        model, tokenizer = load_pretrained(
            m.name,
            dtype=m.dtype,
            param_dtype=m.param_dtype,
            mesh=mesh,
            remat=m.remat,
            remat_policy=m.get("remat_policy", "full"),
            attention=m.get("attention", "auto"),
            scan_layers=bool(m.get("scan_layers", True)),
        )
        if tokenizer is None and m.tokenizer:
            tokenizer = build_tokenizer(m.tokenizer)
        if tokenizer is None:
            # The sampler would fail later, at the first prompt, far from the cause.
            raise ValueError(
                f"config.model.name={m.name!r} came without a tokenizer (no tokenizer.json / "
                "tokenizer_config.json / tokenizer.model there); the trainer needs one to "
                "encode prompts. Add the files, or set --config.model.tokenizer to a "
                "tokenizer directory or registered name."
            )
        _check_kernel(model.cfg)
        return model, tokenizer
    tokenizer = build_tokenizer(m.tokenizer)
    overrides = dict(m.tiny.to_dict())
    overrides.setdefault("vocab_size", len(tokenizer))
    for field, attr in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "pad_token_id"),
    ):
        if getattr(tokenizer, attr, None) is not None:
            overrides.setdefault(field, int(getattr(tokenizer, attr)))
    overrides.setdefault("attention", m.get("attention", "auto"))
    overrides.setdefault("scan_layers", bool(m.get("scan_layers", True)))
    overrides.setdefault("remat_policy", m.get("remat_policy", "full"))
    mc = ModelConfig.tiny(dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat, **overrides)
    if mc.vocab_size < len(tokenizer):
        raise ValueError(
            f"config.model.tiny.vocab_size={mc.vocab_size} is smaller than the "
            f"tokenizer's {len(tokenizer)} tokens; raise it or leave it unset."
        )
    _check_kernel(mc)
    return create_model(mc, mesh=mesh, seed=cfg.seed), tokenizer


def _check_kernel(mc: Any) -> None:
    """The attention kernel's limits for this model (cuDNN's head dims), as a ConfigError
    now rather than a traceback from the first compile."""
    from gdpo_jax.models.attention import attention_kind

    try:
        attention_kind(mc)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def process_info() -> tuple[int, int]:
    return jax.process_index(), jax.process_count()
