"""gdpo_jax: multi-reward RL (GDPO, GRPO and variants) for language models in JAX."""

from gdpo_jax.quiet_start import import_jax as _import_jax

# First, before any submodule imports JAX: its start without the CUDA plugin's
# driver-probe lines on a machine with no GPU (gdpo_jax/quiet_start.py).
_import_jax()

__version__ = "0.1.0"
