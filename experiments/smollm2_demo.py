r"""SmolLM2-135M on CPU, run and summarized: the table of docs/results.md.

    python -m experiments.smollm2_demo --workdir=runs/smollm2_demo \
        --out_dir=docs/results/smollm2_toolcall

Evaluates the starting policy (greedy, the 16 held-out prompts: "step 0"),
then trains configs/smollm2_toolcall.py (20 steps of 4 prompts x 4 samples,
greedy held-out evals at steps 10 and 20) in --workdir, and writes
``summary.json``, ``summary.md`` and the run's own records (``run/``: metrics.jsonl,
the step-0 eval, the wall time, the config) to --out_dir: the cost per RL step (median
seconds over the steps after the first), the first step's extra (mostly
compilation), the wall time, the sampled rewards by 5-step windows, the
held-out evals and the policy entropy at the first and last step, with the
machine. ``--summary_only`` re-renders them from the workdir's files.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from typing import Any

from absl import app, flags, logging

FLAGS = flags.FLAGS
REWARDS = ("toolcall_format", "toolcall_correctness")
EVALS = ("format", "correctness", "accuracy")
WINDOW = 5  # steps per window of the sampled rewards
RUN_FILES = ("metrics.jsonl", "eval_step0.json", "wall_s.json", "config.json")


def define_flags() -> None:
    flags.DEFINE_string("workdir", "runs/smollm2_demo", "The training run's directory.")
    flags.DEFINE_string("out_dir", "docs/results/smollm2_toolcall", "Where the summary goes.")
    flags.DEFINE_bool("summary_only", False, "Only re-render the summary from --workdir.")
    flags.DEFINE_string("config_arg", "", "get_config's argument ('runlocal': 2 steps).")


def summarize(rows: list[dict], eval0: dict, wall_s: float) -> dict[str, Any]:
    """rows: the run's metrics.jsonl records (one per step, "step" = steps done);
    eval0: the starting policy's eval/* metrics; wall_s: seconds of the whole
    run (step-0 eval included) -> the summary's numbers (JSON-able)."""
    steps = [r for r in rows if "time/iter_s" in r]
    later = steps[1:] or steps

    def med(key: str) -> float:
        return statistics.median(r[key] for r in later)

    windows = []
    for i in range(0, len(steps), WINDOW):
        part = steps[i : i + WINDOW]
        windows.append(
            {
                "steps": f"{part[0]['step']}-{part[-1]['step']}",
                **{n: statistics.mean(r[f"reward/{n}/mean"] for r in part) for n in REWARDS},
            }
        )
    evals = {0: {k: eval0[f"eval/{k}"] for k in EVALS}}
    for r in rows:
        if f"eval/{EVALS[0]}" in r:
            evals[int(r["step"])] = {k: r[f"eval/{k}"] for k in EVALS}
    return {
        "steps": len(steps),
        "iter_s": med("time/iter_s"),
        "sample_s": med("time/sample_s"),
        "step_s": med("time/step_s"),
        "reward_s": med("time/reward_s"),
        "first_step_extra_s": steps[0]["time/iter_s"] - med("time/iter_s"),
        "wall_s": wall_s,
        "windows": windows,
        "evals": {str(k): v for k, v in sorted(evals.items())},
        "entropy_first_last": [steps[0]["entropy"], steps[-1]["entropy"]],
    }


def render(summary: dict, machine: str) -> str:
    """The markdown table of a summary."""
    s = summary
    win = s["windows"]
    ev = s["evals"]

    def path(key: str, fmt: str) -> str:
        return " -> ".join(format(ev[k][key], fmt) for k in sorted(ev, key=int))

    lines = [
        "| | |",
        "|---|---|",
        f"| cost per RL step (median of steps 2-{s['steps']}) | {s['iter_s']:.1f} s (sample "
        f"{s['sample_s']:.1f} s, train step {s['step_s']:.1f} s, rewards {s['reward_s']:.3f} s) |",
        f"| first step | adds {s['first_step_extra_s']:.0f} s (compilation) |",
        f"| {s['steps']} steps, evals included | {s['wall_s'] / 60:.1f} min |",
        f"| sampled format reward, steps {' / '.join(w['steps'] for w in win)} | "
        + " / ".join(f"{w['toolcall_format']:.2f}" for w in win)
        + " |",
        "| sampled correctness, same windows | "
        + " / ".join(f"{w['toolcall_correctness']:.2f}" for w in win)
        + " |",
        f"| greedy held-out eval (16 prompts), steps {' -> '.join(sorted(ev, key=int))} | "
        f"format {path('format', '.2f')}; correctness {path('correctness', '.2f')}; "
        f"exact-call accuracy {path('accuracy', '.2f')} |",
        f"| policy entropy, step 1 -> {s['steps']} | "
        f"{s['entropy_first_last'][0]:.2f} -> {s['entropy_first_last'][1]:.2f} |",
    ]
    return "\n".join(lines) + f"\n\n{machine}; one run, seed 0."


def _machine() -> str:
    from benchmarks.common import machine_info

    m = machine_info()
    return f"{m.get('cpu_model')} ({m.get('cpu_isa', '')}), {m.get('cpu_usable')} cores"


def _train(cfg: Any, eval0_path: str, trainer_cls: Any) -> None:
    """The step-0 eval (written to `eval0_path`) and the run, under the run's
    compile-cache rule (`compile_cache.compiled_fresh_for_run`: on several CPU devices
    programs loaded from the persistent cache can deadlock; the demo built its Trainer
    outside it)."""
    from gdpo_jax import compile_cache

    with compile_cache.compiled_fresh_for_run(cfg):
        trainer = trainer_cls(cfg)
        eval0 = trainer.evaluate()
        with open(eval0_path, "w") as f:
            json.dump(eval0, f)
        trainer.run()


def main(argv: list[str]) -> None:
    from configs import smollm2_toolcall
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.train import cli
    from gdpo_jax.train.metrics import read_jsonl
    from gdpo_jax.train.paths import check_output

    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    try:
        cfg = smollm2_toolcall.get_config(FLAGS.config_arg)
    except ValueError as e:
        cli.fail(f"--config_arg: {e}")
    cfg.workdir = FLAGS.workdir
    eval0_path = os.path.join(FLAGS.workdir, "eval_step0.json")
    try:  # before the run: the summary goes there after it
        check_output(FLAGS.out_dir, "--out_dir", is_dir=True)
        # Every file the summary reads (a plain train workdir, or a demo killed before
        # its end, has metrics.jsonl alone: the summary stopped on a traceback).
        missing = [n for n in RUN_FILES if not os.path.isfile(os.path.join(FLAGS.workdir, n))]
        if FLAGS.summary_only and missing:
            raise ConfigError(
                f"--summary_only: --workdir={FLAGS.workdir} holds no finished smollm2_demo "
                f"run (missing {', '.join(missing)}); run the demo without --summary_only."
            )
    except ConfigError as e:
        cli.fail(e)
    if not FLAGS.summary_only:
        from gdpo_jax.train import logs
        from gdpo_jax.train.config import validate_config
        from gdpo_jax.train.loop import Trainer

        logs.setup_logging("info")
        try:
            validate_config(cfg)
        except ConfigError as e:  # names config.workdir: the flag is --workdir
            cli.fail(str(e).replace("config.workdir", "--workdir"))
        if os.path.exists(os.path.join(FLAGS.workdir, "metrics.jsonl")):
            raise SystemExit(f"--workdir={FLAGS.workdir} holds a run already; use a new one.")
        os.makedirs(FLAGS.workdir, exist_ok=True)
        logs.save_config(cfg)
        t0 = time.perf_counter()
        _train(cfg, eval0_path, Trainer)
        with open(os.path.join(FLAGS.workdir, "wall_s.json"), "w") as f:
            json.dump(time.perf_counter() - t0, f)
    # One record per step (a step logged twice keeps its last), as every report reads.
    rows = [
        rec for _, rec in sorted(read_jsonl(os.path.join(FLAGS.workdir, "metrics.jsonl")).items())
    ]
    with open(eval0_path) as f:
        eval0 = json.load(f)
    with open(os.path.join(FLAGS.workdir, "wall_s.json")) as f:
        wall_s = json.load(f)
    summary = summarize(rows, eval0, wall_s)
    machine = _machine()
    # The run's own records go with the summary, so it can be re-derived from them.
    os.makedirs(os.path.join(FLAGS.out_dir, "run"), exist_ok=True)
    for name in RUN_FILES:
        shutil.copy(os.path.join(FLAGS.workdir, name), os.path.join(FLAGS.out_dir, "run", name))
    with open(os.path.join(FLAGS.out_dir, "summary.json"), "w") as f:
        json.dump({"machine": machine, "summary": summary}, f, indent=2)
    table = render(summary, machine)
    with open(os.path.join(FLAGS.out_dir, "summary.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    logging.info("wrote %s/summary.{json,md}", FLAGS.out_dir)


def run() -> None:
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
