"""gdpo_jax: multi-reward RL (GDPO, GRPO and variants) for language models in JAX."""

__version__ = "0.1.0"
