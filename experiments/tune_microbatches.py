r"""Which algo.num_microbatches runs this config's RL step fastest on this machine?

    python -m experiments.tune_microbatches --config=configs/smollm2_toolcall.py
    python -m experiments.tune_microbatches --config=configs/tiny_cpu.py --counts=1,2,4,8 \
        --steps=5 --json=runs/tune/tiny_cpu.json

Builds the config's model, mesh and step as a run would, on a synthetic batch
at the config's widest shapes (`--prompt_len` picks a shorter prompt bucket;
`gdpo_jax/train/tune.py`), times the step for
each count interleaved (one step of each per round), prints a table and the
fastest count as an override, and writes JSON. Counts the config rejects are
listed with the reason; a count over the device's memory is reported as such
(`experiments.plan --fewest_microbatches` answers the memory question ahead of
time, for a target you do not have). Default counts: 1, 2, 4, 8, 16 and the
config's own.
"""

from __future__ import annotations

import json
import logging
import os

from absl import flags

from gdpo_jax.train import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    """This tool's flags, defined when it runs (not at import: two tools defining
    --steps / --json could not be imported into one process)."""
    flags.DEFINE_list(
        "counts", [], "Micro-batch counts to time (default 1,2,4,8,16 and the config's)."
    )
    flags.DEFINE_integer("steps", 3, "Timed steps per count (after one compiling step).")
    flags.DEFINE_integer(
        "prompt_len",
        None,
        "Prompt width to time: one of the run's prompt buckets (default the widest).",
    )
    flags.DEFINE_string("json", "runs/tune/microbatches.json", "Where to write the result as JSON.")


log = logging.getLogger("gdpo_jax.tune")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.train.tune import format_table, time_microbatches

    cfg = flags.FLAGS.config
    try:
        counts = [int(c) for c in FLAGS.counts] or [1, 2, 4, 8, 16]
    except ValueError:
        cli.fail(f"--counts={','.join(FLAGS.counts)}: give integers, e.g. 1,2,4")
    if any(c < 1 for c in counts):
        cli.fail(f"--counts={','.join(map(str, counts))}: counts must be >= 1")
    if FLAGS.steps < 1:
        cli.fail(f"--steps={FLAGS.steps} must be >= 1 (timed steps per count).")
    from gdpo_jax.train.paths import check_output

    try:
        check_output(FLAGS.json, "--json", is_dir=False)  # before the step is compiled
    except ConfigError as e:
        cli.fail(e)
    if int(cfg.algo.num_microbatches) not in counts:
        counts.append(int(cfg.algo.num_microbatches))
    log.info("timing the RL step at num_microbatches %s, %d steps each", counts, FLAGS.steps)
    try:
        result = time_microbatches(
            cfg,
            sorted(counts),
            steps=FLAGS.steps,
            log=log.info,
            progress=True,
            prompt_len=FLAGS.prompt_len,
        )
    except ConfigError as e:
        cli.fail(e)
    from benchmarks.common import describe_machine, machine_info, machine_kind

    info = machine_info()
    result.update(machine=info, machine_kind=machine_kind(info))
    print(f"{describe_machine(info)} ({info['cpu_isa']})")
    print(format_table(result))
    if result["fastest"] is None:
        print("no count ran: see the reasons above")
    else:
        r = result["counts"][result["fastest"]]
        print(
            f"fastest: --config.algo.num_microbatches={result['fastest']}  "
            f"({r['median_s']:.3f} s per step; {result['rows']} rows of "
            f"{result['prompt_len']} + {result['new_tokens']} tokens, {result['backend']})"
        )
    if FLAGS.json:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.json)), exist_ok=True)
        with open(FLAGS.json, "w") as f:
            json.dump(
                {**result, "counts": {str(k): v for k, v in result["counts"].items()}}, f, indent=1
            )
        log.info("wrote %s", FLAGS.json)


def run() -> None:
    define_flags()
    cli.run_config_main(main)


if __name__ == "__main__":
    run()
