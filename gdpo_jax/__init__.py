"""gdpo_jax: multi-reward RL (GDPO, GRPO and variants) for language models in JAX."""

from gdpo_jax import hostenv as _hostenv

# A CLI or benchmark whose main re-executes with the malloc tunable does so here,
# before anything below: the process it replaces would otherwise import JAX for
# nothing (gdpo_jax/hostenv.py). Nothing else has run yet, so nothing is lost.
_hostenv.relaunch_entry_point()

from gdpo_jax import xla_cpu as _xla_cpu  # noqa: E402
from gdpo_jax.quiet_start import import_jax as _import_jax  # noqa: E402

# Before JAX starts: programs over several CPU devices run under XLA:CPU's ordered
# scheduler, with a thread pool their waiting collectives cannot fill
# (gdpo_jax/xla_cpu.py): both deadlocked otherwise.
_xla_cpu.use_ordered_scheduler()
_pool_set = _xla_cpu.use_collective_pool()

# First, before any submodule imports JAX: its start without the CUDA plugin's
# driver-probe lines on a machine with no GPU (gdpo_jax/quiet_start.py).
_import_jax()
if _pool_set:  # the pool's size is this process's, not its children's
    _xla_cpu.pool_setting_for_this_process_only()

__version__ = "0.1.0"
