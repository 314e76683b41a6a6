"""A tiny task, tokenizer and rewards for trainer tests (registered on import).

Task "test_words": prompts "w7 w8 ..." (plain strings, no chat template);
rewards "test_has_w10" (1 if the word w10 appears) and "test_short" (1 if at
most 3 words): two binary rewards a random tiny policy hits sometimes.
"""

from __future__ import annotations

import numpy as np

from gdpo_jax.data.tokenizer_registry import register_tokenizer
from gdpo_jax.rewards import register_reward
from gdpo_jax.tasks import TaskData, register_task
from gdpo_jax.train.config import base_config
from tests._tiny_tokenizer import make_tiny_tokenizer

VOCAB = 32


@register_tokenizer("test_tiny")
def _tok():
    return make_tiny_tokenizer(VOCAB)


@register_reward("test_has_w10")
def has_w10(prompts, completions, **kw):
    return [float("w10" in c.split()) for c in completions]


@register_reward("test_short")
def short(prompts, completions, **kw):
    return [float(len(c.split()) <= 3) for c in completions]


def _records(n: int, seed: int) -> list[dict]:
    r = np.random.default_rng(seed)
    return [
        {"prompt": " ".join(f"w{i}" for i in r.integers(6, VOCAB, r.integers(2, 5))), "id": k}
        for k in range(n)
    ]


@register_task("test_words")
def _task(cfg) -> TaskData:
    def evaluate(completions, records, **kw):
        return {"frac_nonempty": float(np.mean([bool(c.strip()) for c in completions]))}

    return TaskData(train=_records(64, 0), eval=_records(6, 1), evaluate=evaluate)


def tiny_config(workdir: str):
    c = base_config()
    c.workdir = workdir
    c.model.tokenizer = "test_tiny"
    c.model.tiny.update(
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            head_dim=16,
        )
    )
    c.task.name = "test_words"
    c.task.chat_template = False
    c.rewards.names = ("test_has_w10", "test_short")
    c.rewards.num_workers = 1
    c.algo.num_prompts = 4
    c.algo.group_size = 4
    c.sampling.max_prompt_len = 8
    c.sampling.max_new_tokens = 6
    c.optim.lr = 3e-3
    c.mesh.num_devices = 1
    c.train.num_steps = 4
    c.train.progress_bar = False
    c.train.tensorboard = False
    c.checkpoint.async_save = False
    return c
