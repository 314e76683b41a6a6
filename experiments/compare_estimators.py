r"""GRPO vs GDPO (and ablations) from one SFT warm start: the CPU replica of the paper's study.

    gdpo-compare --task=toolcall --size=small    # ~10 min on 2 cores: 2 estimators x 2 seeds
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
   resumes from its last checkpoint.
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

import importlib.util
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any

from absl import app, flags

# Reporting lives in compare_report; re-exported (tests and notebooks use ce.report etc.).
from experiments.compare_report import (  # noqa: F401
    TABLE,
    _read_json,
    _stats,
    load_runs,
    markdown,
    report,
    warm_start_values,
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ESTIMATORS = ("grpo", "grpo_no_std", "gdpo", "gdpo_no_bn")
# Presets: config option (configs/*.py arg), default estimators and seeds, and
# overrides applied before the command line's (RL runs, SFT warm start).
SIZES: dict[str, dict[str, Any]] = {
    "quick": {
        "quick": True,
        "estimators": ("grpo", "gdpo"),
        "seeds": 1,
        "rl": (),
        "sft": (),
    },
    "small": {
        "quick": False,
        "estimators": ("grpo", "gdpo"),
        "seeds": 2,
        # Half the warm start (format ~0.7 learned, values not copied yet) leaves
        # RL a format reward to climb within 30 steps.
        "rl": (
            ("train.num_steps", "30"),
            ("train.eval_every", "10"),
            ("train.eval_num_examples", "32"),
        ),
        "sft": (("sft.num_steps", "100"),),
    },
    "full": {"quick": False, "estimators": ESTIMATORS, "seeds": 5, "rl": (), "sft": ()},
}
Overrides = Sequence[tuple[str, str]]
log = logging.getLogger("gdpo_jax.compare")


def config_path(name: str) -> str:
    """configs/<name>.py of the project (installed package, or the repository's)."""
    return os.path.join(cli.configs_dir() or os.path.join(ROOT, "configs"), f"{name}.py")


def load_config(path: str, arg: str = "") -> Any:
    """`get_config(arg)` of a configs/*.py file (unlocked: the caller overrides fields)."""
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    if root not in sys.path:  # config files import each other as `configs.<name>`
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location(f"_cfg_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def enable_compilation_cache(path: str) -> None:
    """XLA persistent cache: identical programs (the sampler, eval) compile once over all runs."""
    import jax

    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


# --------------------------------------------------------------- running
def sft_config(task: str, sft_dir: str, *, quick: bool, overrides: Overrides = ()) -> Any:
    """configs/sft_<task>.py with the warm start's settings and `overrides` (validated)."""
    from gdpo_jax.train.sft import validate_sft_config

    cfg = load_config(config_path(sft_config_name(task)), "runlocal" if quick else "")
    cfg.workdir = sft_dir
    cfg.train.progress_bar = False
    cfg.sft.evaluate = not quick  # the RL runs evaluate the warm start at step 0 anyway
    cli.apply_overrides(cfg, overrides, "--sft_config")
    validate_sft_config(cfg)
    return cfg


def warm_start(task: str, sft_dir: str, *, quick: bool, overrides: Overrides = ()) -> str:
    """HF dir of the SFT policy; trains it (configs/sft_<task>.py) when missing."""
    if sft_config_name(task) is None:
        return ""  # RL from a random init
    hf = os.path.join(sft_dir, "hf")
    if os.path.exists(os.path.join(hf, "config.json")):
        return hf
    from gdpo_jax.train import logs
    from gdpo_jax.train.sft import run_sft

    cfg = sft_config(task, sft_dir, quick=quick, overrides=overrides)
    logs.save_config(cfg)
    log.info("training the warm start into %s", sft_dir)
    return run_sft(cfg)["hf_dir"]


def run_config(
    task: str,
    *,
    estimator: str,
    seed: int,
    workdir: str,
    model: str,
    quick: bool,
    overrides: Overrides | dict[str, str] | None = None,
    variant: str = "",
) -> Any:
    """The shared replica config with only estimator, seed and workdir set per run.

    variant: extra option(s) of configs/replica_<task>.py (e.g. "plain" for math).
    overrides: (dotted field, command-line string) pairs, typed like the field;
      a bad one raises ConfigError naming `--config.<field>`.
    """
    arg = ",".join(x for x in ("quick" if quick else "", variant) if x)
    cfg = load_config(config_path(rl_config_name(task)), arg)
    if isinstance(overrides, dict):
        overrides = list(overrides.items())
    cli.apply_overrides(cfg, overrides or (), "--config")
    if model:  # "" keeps the config's own model (a random-init study)
        cfg.model.name = model
    cfg.workdir = workdir
    cfg.algo.estimator, cfg.seed = estimator, int(seed)
    return cfg


def run_one(cfg: Any) -> dict[str, Any]:
    """Step-0 held-out eval + the RL run; writes run_info.json when finished.

    A run killed earlier resumes from its last checkpoint (the Trainer does
    this) and keeps its step-0 eval: evaluating again would score the resumed
    weights, not the warm start.
    """
    from gdpo_jax.train.loop import Trainer
    from gdpo_jax.train.metrics import MetricsWriter

    t0, c0 = time.perf_counter(), time.process_time()
    trainer = Trainer(cfg)
    t_build = time.perf_counter() - t0
    resumed_from = trainer.start_step
    if resumed_from == 0:
        with MetricsWriter(cfg.workdir, tensorboard=False, progress_bar=False) as w:
            w.write(0, trainer.evaluate())
    else:
        log.info("%s: resuming from step %d", cfg.workdir, resumed_from)
    t_eval0 = time.perf_counter() - t0 - t_build
    final = trainer.run()
    info = {
        "estimator": cfg.algo.estimator,
        "seed": cfg.seed,
        "done": True,
        "seconds": time.perf_counter() - t0,
        "build_s": t_build,
        "eval0_s": t_eval0,
        # CPU seconds of this process (all threads): close to the wall time on an
        # idle machine, and unaffected by other jobs sharing the cores.
        "cpu_s": time.process_time() - c0,
        "num_steps": cfg.train.num_steps,
        "resumed_from": resumed_from,
        "final": final,
    }
    if cfg.train.stop_after_step and cfg.train.stop_after_step < cfg.train.num_steps:
        info["done"] = False  # stopped on purpose: not finished, the next call resumes it
        return info
    with open(os.path.join(cfg.workdir, "run_info.json"), "w") as f:
        json.dump(info, f, indent=2, allow_nan=True)
    # Finished: the comparison needs the metrics, not the resume state.
    shutil.rmtree(os.path.join(cfg.workdir, "checkpoints"), ignore_errors=True)
    return info


def prepare(
    task: str,
    *,
    out_dir: str,
    estimators: Sequence[str],
    seeds: Sequence[int],
    quick: bool,
    sft_dir: str,
    overrides: Overrides | dict[str, str] | None,
    sft_overrides: Overrides,
    variant: str,
) -> tuple[str, dict[tuple[str, int], Any]]:
    """Every config of the comparison, validated before anything trains.

    Returns (the warm start's directory, (estimator, seed) -> RL config). Raises
    ConfigError on the first bad flag, override or field.
    """
    from gdpo_jax.train.config import validate_config

    if task not in TABLE:
        raise ConfigError(f"--task={task!r}; choose one of {sorted(TABLE)}.")
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown:
        raise ConfigError(f"--estimators: unknown {unknown}; choose from {ESTIMATORS}.")
    if "://" in out_dir:
        raise ConfigError(f"--out_dir={out_dir!r}: the comparison needs a local directory.")
    sft_dir = sft_dir or os.path.join(out_dir, "sft")
    model = os.path.join(sft_dir, "hf") if sft_config_name(task) else ""
    if model and not os.path.exists(os.path.join(model, "config.json")):
        sft_config(task, sft_dir, quick=quick, overrides=sft_overrides)  # validates
    configs = {}
    for seed in seeds:
        for est in estimators:
            try:
                cfg = run_config(
                    task,
                    estimator=est,
                    seed=seed,
                    workdir=os.path.join(out_dir, "runs", est, f"seed{seed}"),
                    model=model,
                    quick=quick,
                    overrides=overrides,
                    variant=variant,
                )
            except ConfigError:
                raise
            except ValueError as e:  # the config file's own options (variant)
                raise ConfigError(f"--variant={variant!r}: {e}") from None
            validate_config(cfg)
            configs[(est, seed)] = cfg
    return model, configs


def run_comparison(
    task: str,
    *,
    out_dir: str,
    estimators: Sequence[str] = ESTIMATORS,
    seeds: Sequence[int] = range(5),
    quick: bool = False,
    sft_dir: str = "",
    force: bool = False,
    overrides: Overrides | dict[str, str] | None = None,
    sft_overrides: Overrides = (),
    window: int = 5,
    variant: str = "",
) -> dict[str, Any]:
    """Validate everything -> warm start -> every (estimator, seed) run -> plots and table."""
    t0 = time.perf_counter()
    _, configs = prepare(
        task,
        out_dir=out_dir,
        estimators=estimators,
        seeds=seeds,
        quick=quick,
        sft_dir=sft_dir,
        overrides=overrides,
        sft_overrides=sft_overrides,
        variant=variant,
    )
    warm_start(task, sft_dir or os.path.join(out_dir, "sft"), quick=quick, overrides=sft_overrides)
    # Seed-major order: stopped early, the finished seeds still cover every estimator.
    for seed in seeds:
        for est in estimators:
            cfg = configs[(est, seed)]
            workdir = cfg.workdir
            if os.path.exists(os.path.join(workdir, "run_info.json")) and not force:
                log.info("%s seed %d: done already, skipped", est, seed)
                continue
            if force and os.path.isdir(workdir):
                shutil.rmtree(workdir)
            # An unfinished run (killed) resumes from its last checkpoint in run_one.
            info = run_one(cfg)
            log.info("%s seed %d: %.0f s", est, seed, info["seconds"])
    table = report(task, out_dir, estimators, seeds, window=window)
    table["total_seconds"] = time.perf_counter() - t0
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(table, f, indent=2, allow_nan=True)
    return table


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
        "With --size=quick: CI size; other sizes keep the study's defaults.",
    )
    flags.DEFINE_enum(
        "size",
        "full",
        list(SIZES),
        "Preset: 'quick' (CI, seconds, learns nothing), 'small' (~10 min on 2 cores: "
        "2 estimators x 2 seeds, 100-step warm start, 30 RL steps), 'full' (~35-60 min).",
    )
    flags.DEFINE_list("estimators", None, "Estimators to compare (default: the --size preset's).")
    flags.DEFINE_integer("seeds", None, "Seeds per estimator, 0 .. seeds-1 (default: preset's).")
    flags.DEFINE_string(
        "out_dir", "", "Default: runs/replica/<task> (runs/replica_<size>/<task> for a preset)."
    )
    flags.DEFINE_string("sft_dir", "", "Warm start dir (default <out_dir>/sft); trained if absent.")
    flags.DEFINE_bool("quick", False, "Same as --size=quick.")
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


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    F = flags.FLAGS
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
    window = 1 if quick else F.window
    sets = []
    for item in F.set:
        field, eq, value = item.partition("=")
        if not eq:
            cli.fail(f"--set={item}: expected --set=<field>=<value>.")
        sets.append((field, value))
    overrides = [*preset["rl"], *sets, *_OVERRIDES["config"]]
    sft_overrides = [*preset["sft"], *_OVERRIDES["sft_config"]]
    if F.report_only:
        table = report(task, out_dir, estimators, seeds, window=window)
        path = os.path.join(out_dir, "results.json")
        if os.path.exists(path):  # keep the measured total time of the run that made them
            table["total_seconds"] = _read_json(path).get("total_seconds")
        with open(path, "w") as f:
            json.dump(table, f, indent=2, allow_nan=True)
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
            prepare(task, **kw)  # every mistake, before the warm start trains
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
        table = run_comparison(task, force=F.force, window=window, **kw)
    print(markdown(table))
    print(f"plots: {table['plots']}")
    print(f"results: {os.path.join(out_dir, 'results.md')}")


def run() -> None:
    """Console script `gdpo-compare`."""
    import sys

    argv, found = cli.split_overrides(sys.argv, tuple(_OVERRIDES))
    _OVERRIDES.update(found)
    define_flags()
    app.run(main, argv=argv, flags_parser=cli.flags_parser(()))


if __name__ == "__main__":
    run()
