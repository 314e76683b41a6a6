"""compare_estimators' runs: the presets (SIZES), the configs (warm start, one RL run
per (estimator, seed)), their validation before anything trains (`prepare`), and
running them one after another in this process (`run_comparison`). The command
line is in compare_estimators, the report in compare_report.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any

from experiments.compare_report import TABLE, read_json_or_none, report, write_json
from experiments.studies import rl_config_name, sft_config_name
from gdpo_jax.train import cli
from gdpo_jax.train.config import ConfigError, config_to_dict, fingerprint

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

    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:  # an unwritable parent ended the comparison with a traceback
        log.warning("no compilation cache (%s: %s); every run compiles its programs", path, e)
        return
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
    from gdpo_jax import compile_cache
    from gdpo_jax.train.loop import Trainer
    from gdpo_jax.train.metrics import MetricsWriter, keep_through

    t0, c0 = time.perf_counter(), time.process_time()
    # The cache enable_compilation_cache turned on, unless the run spans several CPU devices.
    with compile_cache.compiled_fresh_for_run(cfg):
        trainer = Trainer(cfg)
        t_build = time.perf_counter() - t0
        resumed_from = trainer.start_step
        if resumed_from == 0:
            # A killed attempt without a checkpoint starts over: its rows (step 0 among
            # them) would stay beside the new ones as duplicates.
            keep_through(os.path.join(cfg.workdir, "metrics.jsonl"), -1)
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
        # What a later comparison over this folder checks before it reuses the run.
        **reuse_key(cfg),
        "config": config_to_dict(cfg),
        "resumed_from": resumed_from,
        "final": final,
    }
    if cfg.train.stop_after_step and cfg.train.stop_after_step < cfg.train.num_steps:
        info["done"] = False  # stopped on purpose: not finished, the next call resumes it
        return info
    write_json(os.path.join(cfg.workdir, "run_info.json"), info)
    # Finished: the comparison needs the metrics, not the resume state.
    shutil.rmtree(os.path.join(cfg.workdir, "checkpoints"), ignore_errors=True)
    return info


def reuse_key(cfg: Any) -> dict[str, Any]:
    """What a finished run must share with this comparison to be reused: the
    fingerprint (the fields a resume keeps) and the resumable fields that still change
    the results (the length and the eval schedule: runs evaluated at other steps or on
    another number of examples were mixed into one table)."""
    return {
        "num_steps": cfg.train.num_steps,
        "eval_every": cfg.train.eval_every,
        "eval_num_examples": cfg.train.eval_num_examples,
        "fingerprint": fingerprint(cfg),
    }


def check_finished_run(cfg: Any) -> bool:
    """Whether `cfg.workdir` holds a finished run (run_info.json) of this very config:
    True to reuse it, False when there is none (or its run_info.json is unreadable: cut
    by a kill, the run is unfinished and resumes); ConfigError when it ran with other
    settings (`reuse_key`; a field it does not record, written by an older version,
    counts as another). Reused, such a run was silently mixed into the new table (a
    60-step seed paired with 200-step ones)."""
    path = os.path.join(cfg.workdir, "run_info.json")
    if not os.path.exists(path):
        return False
    info = read_json_or_none(path)
    if info is None:
        log.warning("%s is unreadable (cut by a kill?): the run is resumed as unfinished", path)
        return False
    want = reuse_key(cfg)
    field = {"fingerprint": "config fingerprint"}
    if isinstance(info.get("config"), dict):
        # The run's own config: compared field by field (config_diff reads a field added
        # to the schema since as its default), so adding a config field does not make
        # every finished run another config's, as the fingerprint's hash does.
        from gdpo_jax.train.config import config_diff

        want.pop("fingerprint")
        changed = config_diff(info["config"], cfg)
    else:
        changed = []
    diff = [
        f"{field.get(k, 'train.' + k)}={info.get(k, 'not recorded')} (now {v})"
        for k, v in want.items()
        if info.get(k) != v
    ] + [f"other {', '.join(changed)}"] * bool(changed)
    if diff:
        raise ConfigError(
            f"{cfg.workdir} holds a finished run of {', '.join(diff)}; its results would be "
            "mixed with the new runs'. Use another --out_dir, or --force to run it again."
        )
    return True


def check_unfinished_run(cfg: Any, name: str, flag: str = "--config", fix: str = "") -> None:
    """ConfigError (one line, naming `name`) when the checkpoints of a killed run in
    `cfg.workdir` cannot be resumed by `cfg`: written with other settings, or (an RL
    run, `flag` --config) past train.num_steps: resumed, the run was recorded as
    finished with the metrics past its end. Checked before anything trains: found when
    the run's turn came, it ended the comparison with a traceback after the runs before
    it had trained. (SFT's length, sft.num_steps, is a field a resume keeps.)"""
    from gdpo_jax.train.checkpoint import Checkpointer
    from gdpo_jax.train.resume_checks import check_resume_config

    if not os.path.isdir(os.path.join(cfg.workdir, "checkpoints")):
        return
    fix = fix or "pass --force to start it again, or use another --out_dir"
    ckpt = Checkpointer.from_config(cfg, read_only=True)
    try:
        last = max(ckpt.all_steps(), default=0)
    finally:
        ckpt.close()
    if flag == "--config" and last > cfg.train.num_steps:
        raise ConfigError(
            f"{name}: the killed run in {cfg.workdir} has a checkpoint at step {last}, past "
            f"{flag}.train.num_steps={cfg.train.num_steps}; resumed, it would be recorded as "
            f"finished with metrics past its end. Set {flag}.train.num_steps>={last}, or {fix}."
        )
    try:
        check_resume_config(cfg)
    except ConfigError as e:
        msg = str(e).replace("--config.", f"{flag}.").rstrip(".")
        raise ConfigError(f"{name}: {msg}; or {fix}.") from None


def check_warm_start(cfg: Any, sft_dir: str) -> None:
    """ConfigError when the warm start in `sft_dir` (trained, or killed with checkpoints)
    was made with other settings than `cfg` (configs/sft_<task>.py and --sft_config.*):
    a finished one was reused and the changed flags ignored without a word."""
    from gdpo_jax.train.config import config_diff

    fix = f"point --sft_dir (or --out_dir) away from {sft_dir} to train a new warm start"
    if not os.path.exists(os.path.join(sft_dir, "hf", "config.json")):
        check_unfinished_run(cfg, "warm start", "--sft_config", fix)
        return
    saved = read_json_or_none(os.path.join(sft_dir, "config.json"))
    if saved is None:
        return  # made by hand or by an older version: nothing to compare against
    diff = config_diff(saved, cfg)
    if diff:
        raise ConfigError(
            f"--sft_config: the warm start in {sft_dir} was trained with other settings "
            f"(differing: {', '.join(diff)}), so these would be ignored; drop the changed "
            f"--sft_config flags, or {fix}."
        )


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
    force: bool = False,
) -> tuple[str, dict[tuple[str, int], Any]]:
    """Every config of the comparison, validated before anything trains.

    Returns (the warm start's directory, (estimator, seed) -> RL config). Raises
    ConfigError on the first bad flag, override or field, and (unless `force`) on a
    killed run's checkpoints or a warm start that these settings cannot continue.
    """
    from gdpo_jax.train.config import validate_config

    if task not in TABLE:
        raise ConfigError(f"--task={task!r}; choose one of {sorted(TABLE)}.")
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown:
        raise ConfigError(f"--estimators: unknown {unknown}; choose from {ESTIMATORS}.")
    twice = sorted({e for e in estimators if list(estimators).count(e) > 1})
    if twice:  # each run was trained twice, into the same directory
        raise ConfigError(f"--estimators names {twice} more than once; name each one once.")
    if "://" in out_dir:
        raise ConfigError(f"--out_dir={out_dir!r}: the comparison needs a local directory.")
    sft_dir = sft_dir or os.path.join(out_dir, "sft")
    model = os.path.join(sft_dir, "hf") if sft_config_name(task) else ""
    if model:  # validated, and checked against the warm start already there
        check_warm_start(sft_config(task, sft_dir, quick=quick, overrides=sft_overrides), sft_dir)
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
    for (est, seed), cfg in configs.items() if not force else ():  # --force starts them over
        if read_json_or_none(os.path.join(cfg.workdir, "run_info.json")) is None:
            check_unfinished_run(cfg, f"{est} seed {seed}")
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
        force=force,
    )
    # Before any work: a finished run of other settings stops the comparison in one line.
    done = {k: not force and check_finished_run(cfg) for k, cfg in configs.items()}
    warm_start(task, sft_dir or os.path.join(out_dir, "sft"), quick=quick, overrides=sft_overrides)
    # Seed-major order: stopped early, the finished seeds still cover every estimator.
    for seed in seeds:
        for est in estimators:
            cfg = configs[(est, seed)]
            workdir = cfg.workdir
            if done[(est, seed)]:
                log.info("%s seed %d: done already, skipped", est, seed)
                continue
            if force and os.path.isdir(workdir):
                shutil.rmtree(workdir)
            # An unfinished run (killed) resumes from its last checkpoint in run_one.
            info = run_one(cfg)
            log.info("%s seed %d: %.0f s", est, seed, info["seconds"])
    table = report(task, out_dir, estimators, seeds, window=window)
    table["total_seconds"] = time.perf_counter() - t0
    write_json(os.path.join(out_dir, "results.json"), table)
    return table
