r"""RL training entry point (GDPO / GRPO) from an ml_collections config file.

    python -m experiments.train --config=configs/tiny_cpu.py --config.workdir=/tmp/run
    python -m experiments.train --config=configs/tiny_cpu.py \
        --config.algo.estimator=grpo --config.workdir=/tmp/run_grpo

Any field can be overridden with --config.a.b=value (the config is locked, so
a misspelled field is an error). Re-running with the same workdir resumes
from its latest checkpoint. Multi-host: set --config.distributed.* (or run
under a cluster environment JAX detects); every process runs this command.
"""

from __future__ import annotations

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a configs/*.py file.", lock_config=True
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    cfg = _CONFIG.value
    if cfg is None:
        raise app.UsageError("--config=configs/<name>.py is required.")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # Before anything touches a device: multi-host set-up.
    from gdpo_jax.train import distributed

    distributed.initialize_from_config(cfg)

    from gdpo_jax.train.config import ConfigError, validate_config

    try:
        validate_config(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    from gdpo_jax.train.loop import train

    final = train(cfg)
    if final:
        keys = [
            k
            for k in sorted(final)
            if k.startswith(("reward/", "eval/"))
            and k.endswith(("/mean",))
            or k.startswith("eval/")
        ]
        logging.getLogger("gdpo_jax.train").info(
            "done: %s", ", ".join(f"{k}={final[k]:.4g}" for k in keys)
        )


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)
