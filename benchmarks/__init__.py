# Importing gdpo_jax first starts JAX quietly (gdpo_jax/quiet_start.py): these
# modules import jax before gdpo_jax, in import order.
import gdpo_jax  # noqa: F401
