"""Moved: the trainer's paper-task loaders live in `gdpo_jax.tasks.sources`
(registry: `gdpo_jax.tasks`). This name re-exports them."""

from gdpo_jax.tasks.sources import _is_file, _load, _load_held_out  # noqa: F401
