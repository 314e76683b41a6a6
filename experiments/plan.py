r"""Will this config fit, and how fast will it go? An ahead-of-time plan on a CPU machine.

    python -m experiments.plan --config=configs/paper_math.py:r1-distill-7b --topology=v5p-16
    python -m experiments.plan --config=configs/paper_toolcall.py:qwen2.5-1.5b \
        --topology=8xh100 --json=/tmp/plan.json
    python -m experiments.plan --config=configs/tiny_cpu.py --topology=cuda:1x1x2:h100

Compiles every program a run executes (fused step, log-prob pass, sampler
prefill + decode) for the target's abstract devices with the config's mesh and
abstract params, prints per-device memory, whether it fits, analytic FLOPs and
a roofline step time; --json writes the same as JSON, with the command line
that made it (`command`), the machine kind and the UTC time. When it does not fit,
--search (on by default) tries the knobs a user would turn and prints the
smallest change that fits as --config overrides; when it fits,
--fewest_microbatches halves algo.num_microbatches while it still fits (fewer,
larger micro-batches run faster on accelerators). Needs the `[aot]` extra
(libtpu + the CUDA plugin; no accelerator). Targets: --topology=help.
"""

from __future__ import annotations

import json
import os
import sys
import time

# Before JAX starts: compile-only use of libtpu needs the CPU backend (libtpu's
# process lock would otherwise stop every other JAX process on this machine);
# the two TPU_* variables silence libtpu's questions about the machine.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a configs/*.py file.", lock_config=True
)
_TOPOLOGY = flags.DEFINE_string("topology", None, "Target, e.g. v5p-16, 8xh100 (help: list).")
_JSON = flags.DEFINE_string("json", "", "Write the plan as JSON here.")
_SEARCH = flags.DEFINE_bool("search", True, "If it does not fit: look for the smallest change.")
_MAX_TRIES = flags.DEFINE_integer("max_tries", 12, "Plans the --search may compile at most.")
_FEWEST = flags.DEFINE_bool(
    "fewest_microbatches",
    False,
    "If it fits: halve algo.num_microbatches while it still fits (faster on accelerators).",
)


def main(argv: list[str]) -> None:
    from gdpo_jax.train import cli

    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    from gdpo_jax.scale.targets import MissingExtraError, TargetError, parse_target, valid_names
    from gdpo_jax.train.config import ConfigError

    if _TOPOLOGY.value == "help":
        print(valid_names())
        sys.exit(0)
    if not _TOPOLOGY.value:
        cli.fail(f"--topology is required; {valid_names()}")
    cfg = _CONFIG.value
    if cfg is None:
        cli.fail("--config=configs/<name>.py is required.")
    from gdpo_jax.scale.plan import PlanError, format_plan, make_plan
    from gdpo_jax.scale.search import fewest_microbatches, find_fit
    from gdpo_jax.train.paths import check_output

    try:
        check_output(_JSON.value, "--json", is_dir=False)  # before minutes of compiling
        if _MAX_TRIES.value < 1:
            raise ConfigError(f"--max_tries={_MAX_TRIES.value} must be >= 1.")
        target = parse_target(_TOPOLOGY.value)
        plan = make_plan(cfg, target)
        print(format_plan(plan))
        if not plan["fits"] and _SEARCH.value:
            fix = find_fit(cfg, target, plan, max_tries=_MAX_TRIES.value, log=print)
            plan["suggestion"] = fix
            if fix:
                print(
                    "fits with: "
                    + " ".join(fix["overrides"])
                    + f"  (peak {fix['peak_gib']:.2f} GiB in {fix['peak_program']}, "
                    f"roofline {fix['est_step_s']:.1f} s per step)"
                )
            else:
                print(
                    "no change or combination of the searched knobs fits within --max_tries "
                    "plans; see docs/scale.md."
                )
        if plan["fits"] and _FEWEST.value:
            fewest = fewest_microbatches(cfg, target, plan, log=print)
            plan["fewest_microbatches"] = fewest
            if fewest:
                print(
                    f"fewest micro-batches that fit: {fewest['overrides'][0]}  (peak "
                    f"{fewest['peak_gib']:.2f} GiB in {fewest['peak_program']})"
                )
            else:
                print("algo.num_microbatches is already the fewest that fits (halving).")
    except (TargetError, ConfigError, PlanError, MissingExtraError) as e:
        cli.fail(e)
    if _JSON.value:
        from benchmarks.common import machine_info, machine_kind
        from experiments.plan_command import plan_command

        plan["command"] = plan_command(sys.argv[1:])  # rebuilt by plan_command.parse_plan_command
        plan["planned_on"] = machine_kind(machine_info())
        plan["planned_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
        with open(_JSON.value, "w") as f:
            json.dump(plan, f, indent=1, default=str)
        print(f"wrote {_JSON.value}")


if __name__ == "__main__":
    from gdpo_jax.train import cli

    # One-line errors (exit 2) for a missing config file, a misspelled field or a bad value.
    app.run(main, flags_parser=cli.flags_parser(("config",)))
