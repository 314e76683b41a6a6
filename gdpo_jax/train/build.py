"""From a config to live objects: model + tokenizer, task data, reward runner.

Tasks and tokenizers are looked up by name in small registries, so a config
(or a notebook, or a test) can add its own without touching the trainer:

    @register_task("my_task")
    def load(cfg) -> TaskData: ...
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh

TaskLoader = Callable[[Any], "TaskData"]
_TASKS: dict[str, TaskLoader] = {}
_TOKENIZERS: dict[str, Callable[[], Any]] = {}


@dataclasses.dataclass
class TaskData:
    """train / eval: records (dicts with "prompt" + reward fields).

    evaluate: optional task metric fn(completions, examples, **kw) -> dict of
      floats (the gdpo_jax.tasks convention), called on held-out completions
      (one entry per completion; examples repeated for k samples per prompt;
      kw: completion_lengths, group_ids and config.task.eval_kwargs).
    """

    train: list[dict]
    eval: list[dict]
    evaluate: Callable[..., dict] | None = None


def register_task(name: str) -> Callable[[TaskLoader], TaskLoader]:
    def deco(fn: TaskLoader) -> TaskLoader:
        _TASKS[name] = fn
        return fn

    return deco


def register_tokenizer(name: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    def deco(fn: Callable[[], Any]) -> Callable[[], Any]:
        _TOKENIZERS[name] = fn
        return fn

    return deco


@register_tokenizer("synthetic_bpe")
def _synthetic_bpe() -> Any:
    # Registered here, not by an import side effect of gdpo_jax.data.tokenizer:
    # the name is known as soon as the trainer is, and builds on first use.
    from gdpo_jax.data.tokenizer import load_tokenizer

    return load_tokenizer()


def list_tasks() -> list[str]:
    _load_builtin_tasks()
    return sorted(_TASKS)


def _load_builtin_tasks() -> None:
    # The task modules register themselves (see gdpo_jax/train/tasks_adapter.py).
    # A failed import is its own error, not "not a registered task" later.
    try:
        import gdpo_jax.train.tasks_adapter  # noqa: F401
    except Exception as e:
        raise ImportError(
            "importing the built-in tasks (gdpo_jax.train.tasks_adapter) failed: "
            f"{type(e).__name__}: {e}"
        ) from e


def load_task(cfg) -> TaskData:
    _load_builtin_tasks()
    name = cfg.task.name
    if name not in _TASKS:
        raise ValueError(
            f"config.task.name={name!r} is not a known task; known: "
            f"{sorted(_TASKS)} (register more with gdpo_jax.train.build.register_task)."
        )
    data = _TASKS[name](cfg)
    if not data.train:
        raise ValueError(f"task {name!r} produced no training records.")
    missing = [i for i, r in enumerate(data.train[:50]) if "prompt" not in r]
    if missing:
        raise ValueError(f"task {name!r}: training record {missing[0]} has no 'prompt' field.")
    return data


def tokenizer_known(name: str) -> bool:
    """`name` is a registered tokenizer or a directory (what build_tokenizer accepts)."""
    return name in _TOKENIZERS or bool(name and os.path.isdir(name))


def build_tokenizer(name: str) -> Any:
    """A registered tokenizer builder, or a local Hugging Face tokenizer directory."""
    if name in _TOKENIZERS:
        return _TOKENIZERS[name]()
    if name and os.path.isdir(name):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    raise ValueError(
        f"config.model.tokenizer={name!r} is neither a registered tokenizer "
        f"({sorted(_TOKENIZERS)}) nor a tokenizer directory; a random-init model "
        "(config.model.name='') needs one."
    )


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
            attention=m.get("attention", "auto"),
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
    mc = ModelConfig.tiny(dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat, **overrides)
    if mc.vocab_size < len(tokenizer):
        raise ValueError(
            f"config.model.tiny.vocab_size={mc.vocab_size} is smaller than the "
            f"tokenizer's {len(tokenizer)} tokens; raise it or leave it unset."
        )
    return create_model(mc, mesh=mesh, seed=cfg.seed), tokenizer


def prompt_length_filter(
    records: list[dict], sampler: Any, max_len: int, chat_template: bool
) -> tuple[list[dict], int]:
    """Drops records whose encoded prompt exceeds `max_len` tokens. Returns (kept, dropped)."""
    kept = []
    for r in records:
        ids = sampler.encode_prompts([r["prompt"]], chat_template)[0]
        if len(ids) <= max_len:
            kept.append(r)
    return kept, len(records) - len(kept)


def process_info() -> tuple[int, int]:
    return jax.process_index(), jax.process_count()
