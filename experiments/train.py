r"""RL training entry point (GDPO / GRPO) from an ml_collections config file.

    gdpo-train --config=configs/tiny_cpu.py --config.workdir=/tmp/run
    python -m experiments.train --config=configs/tiny_cpu.py \
        --config.algo.estimator=grpo --config.workdir=/tmp/run_grpo

Any field can be overridden with --config.a.b=value (the config is locked, so
a misspelled field is an error: one line, exit status 2, before any work).
`--config` is a path relative to the current directory, or to the project's
configs/ when no such file is there. Re-running with the same workdir resumes
from its latest checkpoint; a finished run says so and prints its summary.
Multi-host: set --config.distributed.* (or run under a cluster environment JAX
detects); every process runs this command.

Writes <workdir>/config.json, metrics.jsonl, tb/ (TensorBoard), plots/*.png
and checkpoints/. `--log_level=debug` shows third-party (Orbax, absl) logs.
"""

from __future__ import annotations

import logging
import time

from absl import flags

from gdpo_jax.train import cli

log = logging.getLogger("gdpo_jax.train")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    cfg = flags.FLAGS.config
    from gdpo_jax.train import logs

    logs.setup_logging(flags.FLAGS.log_level)
    from gdpo_jax.errors import NonFiniteUpdateError, PreemptedError
    from gdpo_jax.train import distributed, paths, resume_checks
    from gdpo_jax.train.config import ConfigError, check_distributed, validate_config

    try:
        check_distributed(cfg)  # the fields the multi-host set-up reads
        # Before anything touches a device: multi-host set-up (a ConfigError, one line,
        # when JAX finds no coordinator to join).
        distributed.initialize_from_config(cfg)
    except ConfigError as e:
        cli.fail(e)
    try:
        validate_config(cfg)
        paths.check_inputs(cfg)  # model and data paths exist, before the build
        # A resume with a changed config stops here, before config.json is replaced.
        resume_checks.check_resume_config(cfg)
    except ConfigError as e:
        cli.fail(e)
    import jax

    lead = jax.process_index() == 0
    if lead:
        logs.save_config(cfg)
        log.info("%s", logs.describe(cfg))
        log.info("workdir %s (resolved config in config.json)", cfg.workdir)
    from gdpo_jax.train.loop import train

    t0 = time.perf_counter()
    try:
        train(cfg)
    except ConfigError as e:  # found once the model or the task is loaded
        cli.fail(e)
    except NonFiniteUpdateError as e:  # one line, not a traceback: the run diverged
        cli.fail_run(e)
    except PreemptedError as e:  # saved, and stopped: the same command resumes
        cli.stop_preempted(e)
    if lead:
        from gdpo_jax.train import plots

        written = plots.plot_run(cfg.workdir, label=cfg.algo.estimator)
        lines = logs.summary(
            cfg.workdir,
            seconds=time.perf_counter() - t0,
            tensorboard=cfg.train.tensorboard,
            plots=written,
        )
        for line in lines:
            log.info("%s", line)


def run() -> None:
    """Console script `gdpo-train`."""
    cli.run_config_main(main)


if __name__ == "__main__":
    run()
