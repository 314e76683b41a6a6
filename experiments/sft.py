r"""SFT warm start entry point (cross-entropy on completion tokens) from a config file.

    gdpo-sft --config=configs/sft_toolcall.py --config.workdir=runs/replica/sft_toolcall
    python -m experiments.sft --config=configs/sft_math.py --config.workdir=runs/replica/math/sft

Any field can be overridden with --config.a.b=value (e.g. --config.sft.num_steps=300);
a mistake is one line and exit status 2. Writes <workdir>/hf (Hugging Face dir:
the RL configs' model.name), <workdir>/config.json, <workdir>/sft_result.json and
<workdir>/metrics.jsonl; rerunning with the same workdir resumes from its latest
checkpoint (when config.checkpoint.every > 0).
"""

from __future__ import annotations

import json
import logging

from absl import flags

from gdpo_jax.train import cli

log = logging.getLogger("gdpo_jax.sft")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    from gdpo_jax.train import logs

    logs.setup_logging(flags.FLAGS.log_level)
    print(json.dumps(dict(_build_and_run(flags.FLAGS.config)), indent=2))


def _build_and_run(cfg) -> dict:
    """Validates `cfg` (a mistake: one line, exit 2), builds the SFT and runs it;
    on several CPU devices every program compiles afresh, as `run_sft` does
    (`gdpo_jax/compile_cache.py`: loaded ones can deadlock in their collectives)."""
    import jax

    from gdpo_jax import compile_cache
    from gdpo_jax.errors import NonFiniteUpdateError, PreemptedError
    from gdpo_jax.train import distributed, logs
    from gdpo_jax.train.config import ConfigError, check_distributed
    from gdpo_jax.train.sft_checks import validate_sft_config

    try:
        check_distributed(cfg)
        # Before anything touches a device, as experiments.train does: without it each
        # process of a multi-host SFT ran alone (SFT.local_batch splits over processes).
        distributed.initialize_from_config(cfg)
    except ConfigError as e:
        cli.fail(e)
    try:
        # The config's own checks (SFT repeats them; they count the devices, so after
        # the multi-host set-up), before the trainer's libraries are imported: a
        # refusal costs the CLI's start and little more.
        validate_sft_config(cfg)
    except ConfigError as e:
        cli.fail(e)
    from gdpo_jax.train.sft import SFT

    with compile_cache.compiled_fresh_for_run(cfg):
        try:
            trainer = SFT(cfg)  # validates first
        except ConfigError as e:
            cli.fail(e)
        if jax.process_index() == 0:
            path = logs.save_config(cfg)
            log.info("SFT into %s (resolved config in %s)", cfg.workdir, path)
        try:
            return trainer.run()
        except NonFiniteUpdateError as e:  # one line, not a traceback: the run diverged
            cli.fail_run(e)
        except PreemptedError as e:  # saved, and stopped: the same command resumes
            cli.stop_preempted(e)


def run() -> None:
    """Console script `gdpo-sft`."""
    cli.run_config_main(main, "Path to a configs/sft_*.py file.")


if __name__ == "__main__":
    run()
