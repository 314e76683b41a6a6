r"""Does the plan hold? The planner's memory and roofline time against a measured run.

    # 1. on any machine with the [aot] extra: plan for the accelerator you have
    python -m experiments.plan --config=configs/paper_math.py:r1-distill-1.5b \
        --config.algo.num_prompts=4 --config.algo.num_minibatches=1 \
        --config.algo.num_microbatches=4 --config.sampling.rows_per_call=64 \
        --topology=1xh200 --json=/tmp/plan.json
    # 2. on that accelerator: the same --config flags, and the plan
    python -m experiments.check_plan --config=configs/paper_math.py:r1-distill-1.5b \
        --config.algo.num_prompts=4 --config.algo.num_minibatches=1 \
        --config.algo.num_microbatches=4 --config.sampling.rows_per_call=64 \
        --plan=/tmp/plan.json --json=runs/check_plan.json

Runs each planned program (the fused step, the log-prob pass when the run has
one, one sampler call) on this machine's devices, each in a fresh process
(`gdpo_jax/scale/measure.py`: random weights of the planned architecture,
synthetic inputs at the config's widest shapes), and prints the plan's
per-device memory and roofline time beside the measured peak memory, median
time and MFU; --json writes the table with the machine, the command line and
the UTC time. A plan for another platform, device count, mesh or model is
refused (one line naming the fix) before any measuring process starts.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time

from absl import flags

from gdpo_jax.train import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    """This tool's flags, defined when it runs (not at import: two tools defining
    --steps / --json could not be imported into one process)."""
    flags.DEFINE_string("plan", None, "A plan's JSON (experiments.plan --json).")
    flags.DEFINE_list("programs", [], "Programs to measure (default: every program of the plan).")
    flags.DEFINE_integer("steps", 3, "Timed calls per program (after one compiling call).")
    flags.DEFINE_string("json", "runs/check_plan.json", "Where to write the comparison.")
    flags.DEFINE_bool(
        "any_platform", False, "Compare even when the plan is for another platform (for tests)."
    )
    # Internal: measure one program in this process and write its figures here.
    flags.DEFINE_string("program", "", "(internal) the one program to measure.")
    flags.DEFINE_string("measure_json", "", "(internal) where --program writes.")
    flags.DEFINE_enum("phase", "run", ["compile", "run"], "(internal) what --program does.")


# The persistent compilation cache the compile phase fills and the run phase reads:
# every program is cached, however fast it compiled.
_CACHE_ENV = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
# The GPU client's up-front memory grab, off in the parent process only.
_PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
_USER_PREALLOCATE = os.environ.get(_PREALLOCATE)
# What a plan must hold for the checks before any process starts (`measure.check_matches`).
_PLAN_KEYS = ("programs", "target", "platform", "num_devices", "mesh")
log = logging.getLogger("gdpo_jax.check_plan")


def _measure_one() -> None:
    from gdpo_jax.scale.arch import PlanError
    from gdpo_jax.scale.measure import measure_program

    with open(FLAGS.plan) as f:
        plan = json.load(f)
    try:
        result = measure_program(
            flags.FLAGS.config,
            FLAGS.program,
            steps=FLAGS.steps,
            plan=plan,
            any_platform=FLAGS.any_platform,
            compile_only=FLAGS.phase == "compile",
        )
    except PlanError as e:
        cli.fail(e)
    with open(FLAGS.measure_json, "w") as f:
        json.dump(result, f)


def _child_env(tmp: str) -> dict[str, str]:
    """A measuring process's environment: this one's, the compilation cache in `tmp`,
    and the user's own GPU preallocation setting (not the parent's, `main`)."""
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.join(tmp, "cache"), **_CACHE_ENV)
    env.pop(_PREALLOCATE, None)
    if _USER_PREALLOCATE is not None:
        env[_PREALLOCATE] = _USER_PREALLOCATE
    return env


def _child(program: str, phase: str, tmp: str) -> dict:
    """Runs this command for one program and phase in a fresh process (its own peak
    counter), the compilation cache in `tmp`; returns what the process measured."""
    path = os.path.join(tmp, f"{program}.{phase}.json")
    argv = [
        a for a in sys.argv[1:] if not a.startswith(("--program=", "--measure_json=", "--phase="))
    ]
    cmd = [sys.executable, "-m", "experiments.check_plan", *argv]
    cmd += [f"--program={program}", f"--phase={phase}", f"--measure_json={path}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(tmp))
    if FLAGS.json:  # the process's own log beside the result, e.g. for a failure
        log_path = f"{os.path.splitext(FLAGS.json)[0]}.{program}.{phase}.log"
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        with open(log_path, "w") as f:
            f.write(done.stderr)
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    if done.returncode == cli.EXIT_USAGE and lines and lines[-1].startswith("error: "):
        cli.fail(lines[-1][len("error: ") :])  # the plan does not match: nothing to measure
    if done.returncode != 0 or not os.path.exists(path):
        raise RuntimeError(f"{program} ({phase}): {lines[-1] if lines else 'failed'}")
    with open(path) as f:
        return json.load(f)


def _measure_in_subprocess(program: str, tmp: str) -> dict:
    """Compiles `program` in one process, then runs it from the cache in another."""
    compiled = _child(program, "compile", tmp)
    ran = _child(program, "run", tmp)
    keep = ("compile_s", "compile_peak_bytes", "compiled")
    return {**ran, **{k: compiled[k] for k in keep}}


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    if FLAGS.program:
        _measure_one()
        return
    # This process only lists the devices and builds the mesh to check the plan; the
    # measuring processes need the accelerator's memory, and on a GPU JAX's client
    # takes 75 % of it when it starts unless told not to. Set before JAX's backend
    # starts (validate_config below); the children get the user's value back (_child).
    os.environ[_PREALLOCATE] = "false"
    if not FLAGS.plan or not os.path.isfile(FLAGS.plan):
        cli.fail(
            f"--plan={FLAGS.plan or ''}: no such file; write one with python -m experiments.plan "
            "--config=... --topology=<this machine's devices> --json=<path>."
        )
    try:
        with open(FLAGS.plan) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        cli.fail(f"--plan={FLAGS.plan}: not a readable JSON file ({type(e).__name__}: {e}).")
    missing = [k for k in _PLAN_KEYS if not isinstance(plan, dict) or k not in plan]
    if missing or not isinstance(plan["programs"], dict):
        cli.fail(
            f"--plan={FLAGS.plan}: not a plan (no {missing or 'programs'}); write one with "
            "python -m experiments.plan --json=<path>."
        )
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.train.paths import check_output

    try:
        check_output(FLAGS.json, "--json", is_dir=False)  # before any program is compiled
    except ConfigError as e:
        cli.fail(e)
    programs = FLAGS.programs or list(plan["programs"])
    unknown = [p for p in programs if p not in plan["programs"]]
    if unknown:
        cli.fail(f"--programs: {unknown} not in the plan (it has {list(plan['programs'])}).")
    if FLAGS.steps < 1:
        cli.fail(f"--steps={FLAGS.steps}: time at least 1 call per program.")
    import jax

    from gdpo_jax.scale.arch import PlanError
    from gdpo_jax.scale.measure import check_matches, compare, format_comparison
    from gdpo_jax.train import mesh as mesh_lib
    from gdpo_jax.train.config import validated_copy

    try:  # bad input: one line before any process starts
        cfg = validated_copy(flags.FLAGS.config, "/tmp/gdpo_check_plan")
        # The plan's platform, devices, mesh and config, checked as each measuring
        # process checks them (validate_config has started JAX here already).
        devices = jax.devices()[: cfg.mesh.num_devices or None]
        mesh = mesh_lib.make_mesh(
            tuple(cfg.mesh.shape), axis_types=cfg.mesh.axis_types, devices=devices
        )
        check_matches(plan, flags.FLAGS.config, mesh, any_platform=FLAGS.any_platform)
    except (ConfigError, PlanError) as e:
        cli.fail(e)

    measured, failed = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in programs:
            log.info("measuring %s (a fresh process: compile, then %d calls)", name, FLAGS.steps)
            try:
                measured[name] = _measure_in_subprocess(name, tmp)
            except RuntimeError as e:  # e.g. out of memory: the plan was wrong
                failed[name] = str(e)
                log.warning("%s", e)
    rows = compare(plan, measured)
    from benchmarks.common import describe_machine, machine_info

    info = machine_info()
    first = next(iter(measured.values()), {})
    print(
        f"plan: {plan['target']} ({plan['device']}); measured on {first.get('devices', '?')} x "
        f"{first.get('device_kind', '?')} ({describe_machine(info)})"
    )
    print(format_comparison(rows))
    for name, why in failed.items():
        print(f"{name}: not measured ({why})")
    if FLAGS.json:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.json)), exist_ok=True)
        with open(FLAGS.json, "w") as f:
            json.dump(
                dict(
                    # The line that made it (check_plan's own flags, as typed).
                    command=shlex.join(["python", "-m", "experiments.check_plan", *sys.argv[1:]]),
                    measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    plan_file=FLAGS.plan,
                    target=plan["target"],
                    model=plan["model"],
                    rows=rows,
                    measured=measured,
                    failed=failed,
                    machine=info,
                ),
                f,
                indent=1,
            )
        log.info("wrote %s", FLAGS.json)
    if failed:
        sys.exit(1)


def run() -> None:
    define_flags()
    cli.run_config_main(main)


if __name__ == "__main__":
    run()
