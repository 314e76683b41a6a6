"""Moved: the prompt stream lives in `gdpo_jax.data.stream`. This name re-exports it."""

from gdpo_jax.data.stream import PromptStream

__all__ = ["PromptStream"]
