"""The trainer: fused sharded step, RL loop, configs, orbax checkpoints, multi-host.

    from gdpo_jax.train import base_config, validate_config, train
    cfg = base_config(); ...; train(cfg)

Heavy pieces (the loop pulls in the sampler, rewards and orbax) load lazily.
"""

from gdpo_jax.lazy_exports import lazy_exports
from gdpo_jax.train.config import ConfigError, base_config, validate_config
from gdpo_jax.train.mesh import make_mesh

_LAZY = {
    "train": "gdpo_jax.train.loop",
    "Trainer": "gdpo_jax.train.loop",
    "CompiledStep": "gdpo_jax.train.step",
    "StepConfig": "gdpo_jax.train.step",
    "train_step": "gdpo_jax.train.step",
    "TrainState": "gdpo_jax.train.state",
    "create_train_state": "gdpo_jax.train.state",
    "make_optimizer": "gdpo_jax.train.state",
    "Checkpointer": "gdpo_jax.train.checkpoint",
    "MetricsWriter": "gdpo_jax.train.metrics",
    "TaskData": "gdpo_jax.tasks",
    "register_task": "gdpo_jax.tasks",
    "register_tokenizer": "gdpo_jax.data.tokenizer_registry",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


__all__ = ["ConfigError", "base_config", "validate_config", "make_mesh", *_LAZY]
