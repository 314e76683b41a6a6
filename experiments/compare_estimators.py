r"""GRPO vs GDPO (and ablations) from one SFT warm start: the CPU replica of the paper's study.

    gdpo-compare --task=toolcall --size=small    # 2 estimators x 2 seeds, 870 CPU-s measured
    python -m experiments.compare_estimators --task=toolcall    # ~35-60 min on 2 idle cores
    python -m experiments.compare_estimators --task=math
    python -m experiments.compare_estimators --size=quick       # CI: seconds, learns nothing
    python -m experiments.compare_estimators --config.train.num_steps=40 \
        --config.rewards.weights='(1.0,2.0)' --sft_config.sft.num_steps=300
    python -m experiments.compare_estimators --study=format_cold    # issue 16: 3 x 10 seeds
    python -m experiments.compare_estimators --study=three_binary --size=quick

Studies (--study, STUDIES): their own configs (configs/study_<name>.py, and
the warm start's, or none: RL from a random init), grpo / grpo_no_std / gdpo
x 10 seeds, into runs/study/<name>; the report adds the share diagnostic,
AUCs, paired differences with 95 % bootstrap CIs and a verdict for each
prediction of experiments/study_predictions.py (experiments/study_report.py).

1. Warm start: `<out_dir>/sft/hf`, trained with configs/sft_<task>.py (plus the
   --sft_config.* overrides) if absent.
2. RL: configs/replica_<task>.py from that warm start, once per (estimator,
   seed); every run gets the same config (plus the --config.* overrides) except
   `algo.estimator` and `seed` (prompt order, sampling). Runs go through the
   trainer's Python API in this process, one after another (the XLA persistent
   compilation cache makes later runs skip most compiles); the held-out split is
   evaluated before the first step too (written as step 0). A finished run is
   not redone (delete its directory or pass --force); an unfinished one (killed)
   resumes from its last checkpoint, and one that cannot (other settings, a
   checkpoint past train.num_steps) is refused before anything trains.
3. Report: `plots/train_<reward>.png` (per-step training reward, moving
   average, median and inter-quartile band over seeds: the paper's Fig. 1b),
   `plots/eval_<metric>.png`, and `results.md` / `results.json`: held-out
   metrics after the last step per estimator (mean, std, median, IQR and the
   per-seed values), with the warm start as the first row.

Every override and every run's config is validated before the warm start
trains: a mistake is one line naming the flag, exit status 2.

Layout: <out_dir>/{sft/, runs/<estimator>/seed<k>/metrics.jsonl, plots/, results.*}.
"""

from __future__ import annotations

import os

from absl import app, flags

# Reporting lives in compare_report; re-exported (tests use ce.report etc.).
from experiments.compare_report import (  # noqa: F401
    TABLE,
    _read_json,
    _stats,
    load_runs,
    markdown,
    read_json_or_none,
    report,
    warm_start_values,
    write_json,
)

# The presets, configs and runners live in compare_runs; re-exported likewise.
from experiments.compare_runs import (  # noqa: F401
    ESTIMATORS,
    ROOT,
    SIZES,
    Overrides,
    check_finished_run,
    config_path,
    enable_compilation_cache,
    load_config,
    log,
    prepare,
    run_comparison,
    run_config,
    run_one,
    sft_config,
    warm_start,
)
from experiments.studies import (  # noqa: F401  (re-exported)
    STUDIES,
    STUDY_ESTIMATORS,
    rl_config_name,
    sft_config_name,
)
from gdpo_jax.train import cli
from gdpo_jax.train.config import ConfigError
from gdpo_jax.train.plots import COLORS, LABELS, band, curve, plot  # noqa: F401  (re-exported)


# ------------------------------------------------------------------ CLI
def define_flags() -> None:
    flags.DEFINE_enum("task", "toolcall", sorted(set(TABLE) - set(STUDIES)), "Which replica.")
    flags.DEFINE_enum(
        "study",
        None,
        sorted(STUDIES),
        "A study of issue 16 instead of --task: its own configs (configs/study_<name>.py), "
        f"estimators {','.join(STUDY_ESTIMATORS)}, 10 seeds, out_dir runs/study/<name>, "
        "paired bootstrap CIs, AUCs, share diagnostic and prediction verdicts. "
        "With --size=quick: CI size; --task and --size=small are refused with it.",
    )
    flags.DEFINE_enum(
        "size",
        "full",
        list(SIZES),
        "Preset: 'quick' (CI, seconds, learns nothing), 'small' (870 CPU-s measured once: "
        "2 estimators x 2 seeds, 100-step warm start, 30 RL steps), 'full' (~35-60 min).",
    )
    flags.DEFINE_list("estimators", None, "Estimators to compare (default: the --size preset's).")
    flags.DEFINE_integer("seeds", None, "Seeds per estimator, 0 .. seeds-1 (default: preset's).")
    flags.DEFINE_string(
        "out_dir", "", "Default: runs/replica/<task> (runs/replica_<size>/<task> for a preset)."
    )
    flags.DEFINE_string("sft_dir", "", "Warm start dir (default <out_dir>/sft); trained if absent.")
    flags.DEFINE_bool("quick", False, "Same as --size=quick (refused with another --size).")
    flags.DEFINE_bool("force", False, "Redo finished runs.")
    flags.DEFINE_bool("report_only", False, "Only redraw plots and table from the runs on disk.")
    flags.DEFINE_integer("window", 5, "Moving-average window of the training curves.")
    flags.DEFINE_string(
        "variant",
        "",
        "Extra option of configs/replica_<task>.py, e.g. 'plain' "
        "(math: length reward not gated on correctness). Default out_dir gets "
        "a _<variant> suffix; the warm start defaults to the base task's.",
    )
    flags.DEFINE_multi_string(
        "set",
        [],
        "Same as --config.<field>=<value> (one per flag; commas stay inside the value).",
    )
    cli.define_log_level()


# Besides the flags above: --config.<field>=<value> (every RL run) and
# --sft_config.<field>=<value> (the warm start), taken out of argv in run().
_OVERRIDES: dict[str, list[tuple[str, str]]] = {"config": [], "sft_config": []}


def curve_window(window: int, *, given: bool, quick: bool) -> int:
    """The curves' moving-average window: --window, or 1 step at the quick size when
    --window is not given (a given one was ignored there)."""
    return 1 if quick and not given else window


def report_only(task: str, out_dir: str, estimators, seeds, *, window: int) -> dict:
    """--report_only: plots, results.md and results.json redrawn from the runs on disk,
    keeping the measured total time of the call that trained them."""
    path = os.path.join(out_dir, "results.json")
    # Read before report() rewrites results.md: a results.json cut by a kill was a
    # traceback after that, and it has no total time to keep.
    total = (read_json_or_none(path) or {}).get("total_seconds")
    table = report(task, out_dir, estimators, seeds, window=window)
    table["total_seconds"] = total
    write_json(path, table)
    return table


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    F = flags.FLAGS
    # Flags another one overrides: refused rather than ignored.
    if F.quick and F["size"].present and F.size != "quick":
        cli.fail(f"--quick is --size=quick, so --size={F.size} would be ignored: pass one of them.")
    if F.study and F["task"].present:
        cli.fail(
            f"--task={F.task}: a --study names its own task (configs/study_*.py); drop --task."
        )
    if F.study and F.size == "small":
        cli.fail(
            "--size=small: a --study runs at its own size (10 seeds), or at --size=quick for CI; "
            "drop --size or use --size=quick."
        )
    from gdpo_jax.train import logs

    logs.setup_logging(F.log_level)
    size = "quick" if F.quick else F.size
    preset = SIZES[size]
    quick = preset["quick"]
    task = F.task
    if F.study:  # the study's own defaults; only --size=quick changes them
        task = F.study
        preset = dict(preset, rl=(), sft=())
        if not quick:
            preset.update(estimators=STUDY_ESTIMATORS, seeds=10)
        base = os.path.join("runs", "study_quick" if quick else "study")
    else:
        base = os.path.join("runs", "replica" if size == "full" else f"replica_{size}")
    out_dir = F.out_dir or os.path.join(base, task + (f"_{F.variant}" if F.variant else ""))
    sft_dir = F.sft_dir or (os.path.join(base, task, "sft") if F.variant else "")
    estimators = F.estimators if F.estimators is not None else list(preset["estimators"])
    seeds = list(range(F.seeds if F.seeds is not None else preset["seeds"]))
    window = curve_window(F.window, given=F["window"].present, quick=quick)
    if not estimators:
        cli.fail("--estimators is empty; name at least one, e.g. --estimators=grpo,gdpo.")
    if not seeds:
        cli.fail(f"--seeds={F.seeds} must be >= 1 (seeds per estimator).")
    if F.window < 1:
        cli.fail(f"--window={F.window} must be >= 1 (steps in the curves' moving average).")
    from gdpo_jax.train.paths import check_output

    try:
        for flag, path in (("--out_dir", out_dir), ("--sft_dir", sft_dir)):
            check_output(path, flag, is_dir=True)  # before the warm start and the runs
    except ConfigError as e:
        cli.fail(e)
    if F.report_only:
        from experiments.compare_report import load_runs

        # An empty table and plots would replace the results.md of another task's runs.
        if not os.path.isdir(out_dir) or not load_runs(out_dir, estimators, seeds):
            cli.fail(
                f"--report_only: --out_dir={out_dir} holds no finished runs of these estimators "
                f"and seeds (runs/<estimator>/seed<k>/ with run_info.json) to report on."
            )
    sets = []
    for item in F.set:
        field, eq, value = item.partition("=")
        if not eq:
            cli.fail(f"--set={item}: expected --set=<field>=<value>.")
        sets.append((field, value))
    overrides = [*preset["rl"], *sets, *_OVERRIDES["config"]]
    sft_overrides = [*preset["sft"], *_OVERRIDES["sft_config"]]
    if F.report_only:
        try:
            table = report_only(task, out_dir, estimators, seeds, window=window)
        except ConfigError as e:  # runs of different lengths
            cli.fail(e)
    else:
        kw = dict(
            out_dir=out_dir,
            estimators=estimators,
            seeds=seeds,
            quick=quick,
            sft_dir=sft_dir,
            overrides=overrides,
            sft_overrides=sft_overrides,
            variant=F.variant,
        )
        try:
            _, configs = prepare(task, force=F.force, **kw)  # every mistake, before any training
            for cfg in configs.values() if not F.force else ():
                check_finished_run(cfg)  # a finished run of other settings in --out_dir
        except ConfigError as e:
            cli.fail(e)
        enable_compilation_cache(
            os.path.join(os.path.dirname(os.path.abspath(out_dir)), ".jax_cache")
        )
        log.info(
            "%s, size %s: %s x %d seeds into %s",
            task,
            size,
            ", ".join(estimators),
            len(seeds),
            out_dir,
        )
        from gdpo_jax.errors import PreemptedError

        try:
            table = run_comparison(task, force=F.force, window=window, **kw)
        except ConfigError as e:  # what only the runs find (e.g. the report's run lengths)
            cli.fail(e)
        except PreemptedError as e:  # the run in flight saved its step; a rerun resumes it
            cli.stop_preempted(e)
    print(markdown(table))
    print(f"plots: {table['plots']}")
    print(f"results: {os.path.join(out_dir, 'results.md')}")


def run() -> None:
    """Console script `gdpo-compare`."""
    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # before JAX starts: huge pages for XLA:CPU buffers
    import sys

    argv, found = cli.split_overrides(sys.argv, tuple(_OVERRIDES))
    _OVERRIDES.update(found)
    define_flags()
    app.run(main, argv=argv, flags_parser=cli.flags_parser(()))


if __name__ == "__main__":
    run()
