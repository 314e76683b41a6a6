"""The command line a committed plan records, and the config it stands for.

Every plan `experiments.plan --json` writes records the command that made it
(`plan["command"]`); `experiments.plan_table` records the equivalent
`experiments.plan` command for each of its plans. `parse_plan_command` rebuilds
the config and topology from such a line with the same flag parsers the CLI
uses, so a test can check that a committed plan's `config_digest` is what its
command plans today, and a reader can rerun any committed figure.
"""

from __future__ import annotations

import shlex

import ml_collections as mlc
from absl import flags
from ml_collections import config_flags

PREFIX = ("python", "-m", "experiments.plan")


def plan_command(argv: list[str]) -> str:
    """The shell line for `python -m experiments.plan` with these flags (argv without the
    program name), quoted so that it can be pasted back into a shell."""
    return shlex.join([*PREFIX, *argv])


def table_command(config: str, arg: str, topology: str, overrides: list[str]) -> str:
    """The `experiments.plan` line equivalent to one plan_table entry: `config` is a
    configs/*.py path, `arg` its get_config argument, `overrides` `--config.x=v` flags."""
    return plan_command([f"--config={config}:{arg}", f"--topology={topology}", *overrides])


def parse_plan_command(command: str) -> tuple[mlc.ConfigDict, str]:
    """(config, topology) that `command` (a `plan_command` line) plans. Paths in it are
    relative to the working directory, as when it was run. Raises ValueError on a line
    that is not an `experiments.plan` command or names no --config / --topology."""
    argv = shlex.split(command)
    if tuple(argv[: len(PREFIX)]) != PREFIX:
        raise ValueError(f"not an experiments.plan command: {command!r}")
    args = ["plan", *argv[len(PREFIX) :]]
    fv = flags.FlagValues()  # a private registry: the process's own flags stay untouched
    # sys_argv: the config flag finds its --config.x overrides in these args, not sys.argv.
    cfg = config_flags.DEFINE_config_file(
        "config", None, "", flag_values=fv, lock_config=True, sys_argv=args
    )
    topology = flags.DEFINE_string("topology", None, "", flag_values=fv)
    fv(args, known_only=True)  # --json, --nosearch and the like do not change the config
    if cfg.value is None or not topology.value:
        raise ValueError(f"the command names no --config or no --topology: {command!r}")
    return cfg.value, topology.value
