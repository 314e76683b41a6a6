r"""GRPO vs GDPO (and their ablations) from one SFT warm start: a CPU replica of the paper's study.

    python -m experiments.compare_estimators --task=toolcall            # ~1 h on 2 idle cores
    python -m experiments.compare_estimators --task=math
    python -m experiments.compare_estimators --task=toolcall --quick    # CI: seconds

1. Warm start: `<out_dir>/sft/hf`, trained with configs/sft_<task>.py if absent.
2. RL: configs/replica_<task>.py from that warm start, once per (estimator,
   seed); every run gets the same config except `algo.estimator` and `seed`
   (prompt order, sampling). Runs go through the trainer's Python API in this
   process, one after another (the XLA persistent compilation cache makes
   later runs skip most compiles); the held-out split is evaluated before the
   first step too (written as step 0). A finished run is not redone (delete
   its directory or pass --force); an unfinished one starts over.
3. Report: `plots/train_<reward>.png` (per-step training reward, moving
   average, median and inter-quartile band over seeds: the paper's Fig. 1b),
   `plots/eval_<metric>.png`, and `results.md` / `results.json`: held-out
   metrics after the last step per estimator (mean, std, median, IQR and the
   per-seed values), with the warm start as the first row.

Layout: <out_dir>/{sft/, runs/<estimator>/seed<k>/metrics.jsonl, plots/, results.*}.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ESTIMATORS = ("grpo", "grpo_no_std", "gdpo", "gdpo_no_bn")
LABELS = {
    "grpo": "GRPO",
    "grpo_no_std": "GRPO w/o std",
    "gdpo": "GDPO",
    "gdpo_no_bn": "GDPO w/o batch norm",
}
COLORS = {
    "grpo": "tab:blue",
    "grpo_no_std": "tab:cyan",
    "gdpo": "tab:red",
    "gdpo_no_bn": "tab:orange",
}
# Held-out metrics of the table: (key in metrics.jsonl, label), per task.
TABLE = {
    "toolcall": [
        ("eval/toolcall_correctness", "correctness reward [-3,3]"),
        ("eval/accuracy", "AST accuracy"),
        ("eval/format", "format"),
        ("eval/len_mean", "length (tokens)"),
    ],
    "math": [
        ("eval/pass@1", "pass@1"),
        ("eval/exceed_ratio", "Exceed ratio"),
        ("eval/length", "length reward"),
        ("eval/mean_length", "length (tokens)"),
    ],
}
log = logging.getLogger("gdpo_jax.compare")


def load_config(path: str, arg: str = "") -> Any:
    """`get_config(arg)` of a configs/*.py file (unlocked: the caller overrides fields)."""
    import sys

    if ROOT not in sys.path:  # config files import each other as `configs.<name>`
        sys.path.insert(0, ROOT)
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
def warm_start(task: str, sft_dir: str, *, quick: bool) -> str:
    """HF dir of the SFT policy; trains it (configs/sft_<task>.py) when missing."""
    hf = os.path.join(sft_dir, "hf")
    if os.path.exists(os.path.join(hf, "config.json")):
        return hf
    from gdpo_jax.train.sft import run_sft

    cfg = load_config(os.path.join(ROOT, "configs", f"sft_{task}.py"), "runlocal" if quick else "")
    cfg.workdir = sft_dir
    cfg.train.progress_bar = False
    cfg.sft.evaluate = not quick  # the RL runs evaluate the warm start at step 0 anyway
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
    overrides: dict[str, Any] | None = None,
    variant: str = "",
) -> Any:
    """The shared replica config with only estimator, seed and workdir set per run.

    variant: extra option(s) of configs/replica_<task>.py (e.g. "plain" for math).
    """
    arg = ",".join(x for x in ("quick" if quick else "", variant) if x)
    cfg = load_config(os.path.join(ROOT, "configs", f"replica_{task}.py"), arg)
    cfg.model.name, cfg.workdir = model, workdir
    cfg.algo.estimator, cfg.seed = estimator, int(seed)
    for dotted, value in (overrides or {}).items():
        node = cfg
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = _parse(value, node[leaf])
    return cfg


def _parse(value: Any, like: Any) -> Any:
    """A command-line string as the type of the field it overrides."""
    if not isinstance(value, str) or isinstance(like, str):
        return value
    if isinstance(like, bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"expected a bool, got {value!r}")
        return value.lower() in ("true", "1")
    if isinstance(like, (tuple, list)):
        import ast

        return tuple(ast.literal_eval(value))
    return type(like)(value)


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


def run_comparison(
    task: str,
    *,
    out_dir: str,
    estimators: Sequence[str] = ESTIMATORS,
    seeds: Sequence[int] = range(5),
    quick: bool = False,
    sft_dir: str = "",
    force: bool = False,
    overrides: dict[str, Any] | None = None,
    window: int = 5,
    variant: str = "",
) -> dict[str, Any]:
    """Warm start -> every (estimator, seed) run -> plots and table. Returns the table dict."""
    if task not in TABLE:
        raise ValueError(f"--task={task!r}; choose one of {sorted(TABLE)}.")
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown:
        raise ValueError(f"unknown estimators {unknown}; choose from {ESTIMATORS}.")
    t0 = time.perf_counter()
    model = warm_start(task, sft_dir or os.path.join(out_dir, "sft"), quick=quick)
    # Seed-major order: stopped early, the finished seeds still cover every estimator.
    for seed in seeds:
        for est in estimators:
            workdir = os.path.join(out_dir, "runs", est, f"seed{seed}")
            if os.path.exists(os.path.join(workdir, "run_info.json")) and not force:
                log.info("%s seed %d: done already, skipped", est, seed)
                continue
            if force and os.path.isdir(workdir):
                shutil.rmtree(workdir)
            # An unfinished run (killed) resumes from its last checkpoint in run_one.
            cfg = run_config(
                task,
                estimator=est,
                seed=seed,
                workdir=workdir,
                model=model,
                quick=quick,
                overrides=overrides,
                variant=variant,
            )
            info = run_one(cfg)
            log.info("%s seed %d: %.0f s", est, seed, info["seconds"])
    table = report(task, out_dir, estimators, seeds, window=window)
    table["total_seconds"] = time.perf_counter() - t0
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(table, f, indent=2, allow_nan=True)
    return table


# ------------------------------------------------------------- reporting
def load_runs(
    out_dir: str, estimators: Sequence[str], seeds: Sequence[int]
) -> dict[str, dict[int, dict[int, dict]]]:
    """estimator -> seed -> step -> record, for the finished runs (their metrics.jsonl)."""
    from gdpo_jax.train.metrics import read_jsonl

    runs: dict[str, dict[int, dict[int, dict]]] = {}
    for est in estimators:
        for seed in seeds:
            path = os.path.join(out_dir, "runs", est, f"seed{seed}", "metrics.jsonl")
            if os.path.exists(os.path.join(os.path.dirname(path), "run_info.json")):  # finished
                runs.setdefault(est, {})[seed] = read_jsonl(path)
    return runs


def curve(records: dict[int, dict], key: str, window: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of `key` over the steps that have it; trailing moving average."""
    steps = np.asarray(sorted(s for s, r in records.items() if key in r), np.int64)
    vals = np.asarray([records[s][key] for s in steps], np.float64)
    if window > 1 and len(vals):
        c = np.cumsum(np.insert(vals, 0, 0.0))
        lo = np.maximum(np.arange(1, len(vals) + 1) - window, 0)
        vals = (c[1:] - c[lo]) / (np.arange(1, len(vals) + 1) - lo)
    return steps, vals


def band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, ...]:
    """Median, 25th and 75th percentile over seeds, on the steps every seed has."""
    common = sorted(set.intersection(*(set(s.tolist()) for s, _ in curves)))
    mat = np.stack([v[np.searchsorted(s, common)] for s, v in curves])
    q25, med, q75 = np.percentile(mat, [25, 50, 75], axis=0)
    return np.asarray(common), med, q25, q75


def plot(
    runs: dict[str, dict[int, dict[int, dict]]], key: str, path: str, *, title: str, window: int = 1
) -> bool:
    """One figure: per estimator, the median over seeds and the IQR band of `key`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.0, 3.4), dpi=110)
    drawn = False
    for est, recs in runs.items():
        curves = [curve(r, key, window) for r in recs.values()]
        curves = [c for c in curves if len(c[0])]
        if not curves:
            continue
        steps, med, q25, q75 = band(curves)
        ax.plot(
            steps,
            med,
            color=COLORS.get(est),
            label=f"{LABELS.get(est, est)} (n={len(curves)})",
            marker="o" if len(steps) < 12 else None,
            ms=3,
        )
        ax.fill_between(steps, q25, q75, color=COLORS.get(est), alpha=0.2, lw=0)
        drawn = True
    if not drawn:
        plt.close(fig)
        return False
    ax.set_xlabel("RL step")
    ax.set_ylabel(key, fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _stats(values: list[float]) -> dict[str, Any]:
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], np.float64)
    if not v.size:
        return {"n": 0, "values": values}
    q25, med, q75 = np.percentile(v, [25, 50, 75])
    return {
        "n": int(v.size),
        "mean": float(v.mean()),
        "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
        "median": float(med),
        "q25": float(q25),
        "q75": float(q75),
        "values": [float(x) for x in values],
    }


def warm_start_values(runs: dict[str, dict[int, dict[int, dict]]], key: str) -> list[float]:
    """One step-0 value of `key` per seed (the mean over that seed's estimators).

    Every estimator of a seed starts from the same weights and evaluates the same
    prompts with the same sampling key, so their step-0 evals are copies of one
    measurement: counting each copy would report n = seeds x estimators and a
    standard deviation over duplicates.
    """
    per_seed: dict[int, list[float]] = {}
    for recs in runs.values():
        for seed, r in recs.items():
            v = r.get(0, {}).get(key)
            if v is not None and math.isfinite(v):
                per_seed.setdefault(seed, []).append(float(v))
    return [float(np.mean(per_seed[s])) for s in sorted(per_seed)]


def report(
    task: str, out_dir: str, estimators: Sequence[str], seeds: Sequence[int], *, window: int = 5
) -> dict[str, Any]:
    """Plots and results.md from the runs on disk. Returns the table dict."""
    runs = load_runs(out_dir, estimators, seeds)
    plots_dir = os.path.join(out_dir, "plots")
    os.makedirs(plots_dir, exist_ok=True)
    some = next((r for recs in runs.values() for r in recs.values()), {})
    keys = sorted({k for rec in some.values() for k in rec})
    plots = []
    for key in [k for k in keys if k.startswith("reward/") and k.endswith("/mean")]:
        name = key.split("/")[1]
        path = os.path.join(plots_dir, f"train_{name}.png")
        if plot(
            runs,
            key,
            path,
            window=window,
            title=f"{task}: training {name}, {window}-step moving avg.\nmedian and IQR over seeds",
        ):
            plots.append(path)
    for key, label in TABLE[task]:
        path = os.path.join(plots_dir, f"eval_{key.split('/')[1].replace('@', 'at')}.png")
        if plot(runs, key, path, title=f"{task}: held-out {label}\nmedian and IQR over seeds"):
            plots.append(path)

    rows: dict[str, Any] = {}
    metrics = [k for k, _ in TABLE[task]]
    rows["warm start (step 0)"] = {k: _stats(warm_start_values(runs, k)) for k in metrics}
    finals: dict[str, dict[int, dict]] = {}
    for est, recs in runs.items():
        finals[est] = {
            seed: r[max(s for s in r if any(k in r[s] for k in metrics))]
            for seed, r in recs.items()
        }
        rows[est] = {k: _stats([f.get(k) for f in finals[est].values()]) for k in metrics}
        rows[est]["final_step"] = int(max(max(r) for r in recs.values()))
    # Same seed = same prompt order and warm start for every estimator, so per-seed
    # differences to GRPO cancel most of the batch-to-batch noise.
    paired: dict[str, Any] = {}
    if "grpo" in finals:
        for est in [e for e in finals if e != "grpo"]:
            common = sorted(set(finals[est]) & set(finals["grpo"]))
            paired[est] = {
                k: _stats(
                    [
                        finals[est][s].get(k, math.nan) - finals["grpo"][s].get(k, math.nan)
                        for s in common
                    ]
                )
                for k in metrics
            }
    timing = {}
    for est in runs:
        infos = [os.path.join(out_dir, "runs", est, f"seed{s}", "run_info.json") for s in seeds]
        infos = [_read_json(p) for p in infos if os.path.exists(p)]
        timing[est] = {
            "wall_s": [i["seconds"] for i in infos],
            "cpu_s": [i.get("cpu_s") for i in infos],
        }
    table = {
        "task": task,
        "estimators": list(runs),
        "seeds": list(seeds),
        "rows": rows,
        "paired_vs_grpo": paired,
        "metrics": metrics,
        "plots": plots,
        "timing": timing,
    }
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(markdown(table))
    return table


def markdown(table: dict[str, Any]) -> str:
    """Mean ± std over seeds, with the median and the number of seeds, per metric."""
    metrics = table["metrics"]
    labels = dict(TABLE[table["task"]])
    lines = [
        "| estimator | " + " | ".join(labels[m] for m in metrics) + " |",
        "|---" * (len(metrics) + 1) + "|",
    ]
    for name, row in table["rows"].items():
        cells = []
        for m in metrics:
            s = row[m]
            cells.append(
                f"{s['mean']:.3f} ± {s['std']:.3f} (med {s['median']:.3f}, n={s['n']})"
                if s["n"]
                else "n/a"
            )
        lines.append(f"| {LABELS.get(name, name)} | " + " | ".join(cells) + " |")
    if table.get("paired_vs_grpo"):
        lines += [
            "",
            "Paired difference to GRPO (same seed), mean ± std over seeds:",
            "",
            "| estimator − GRPO | " + " | ".join(labels[m] for m in metrics) + " |",
            "|---" * (len(metrics) + 1) + "|",
        ]
        for name, row in table["paired_vs_grpo"].items():
            cells = [
                f"{row[m]['mean']:+.3f} ± {row[m]['std']:.3f} (n={row[m]['n']})"
                if row[m]["n"]
                else "n/a"
                for m in metrics
            ]
            lines.append(f"| {LABELS.get(name, name)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ CLI
def define_flags() -> None:
    flags.DEFINE_enum("task", "toolcall", sorted(TABLE), "Which replica.")
    flags.DEFINE_list("estimators", list(ESTIMATORS), "Estimators to compare.")
    flags.DEFINE_integer("seeds", 5, "Seeds per estimator (0 .. seeds-1).")
    flags.DEFINE_string("out_dir", "", "Default: runs/replica/<task> (runs/replica_quick/<task>).")
    flags.DEFINE_string("sft_dir", "", "Warm start dir (default <out_dir>/sft); trained if absent.")
    flags.DEFINE_bool("quick", False, "CI size: tiny warm start, 2 estimators x 1 seed x 2 steps.")
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
    flags.DEFINE_list("set", [], "Shared config overrides for every run, e.g. train.num_steps=40.")


def main(argv: list[str]) -> None:
    del argv
    F = flags.FLAGS
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    base = os.path.join("runs", "replica_quick" if F.quick else "replica")
    out_dir = F.out_dir or os.path.join(base, F.task + (f"_{F.variant}" if F.variant else ""))
    sft_dir = F.sft_dir or (os.path.join(base, F.task, "sft") if F.variant else "")
    estimators = F.estimators
    seeds = list(range(F.seeds))
    if F.quick and F["estimators"].using_default_value:
        estimators = ["grpo", "gdpo"]
    if F.quick and F["seeds"].using_default_value:
        seeds = [0]
    overrides = dict(item.split("=", 1) for item in F.set)
    if F.report_only:
        table = report(F.task, out_dir, estimators, seeds, window=1 if F.quick else F.window)
        path = os.path.join(out_dir, "results.json")
        if os.path.exists(path):  # keep the measured total time of the run that made them
            table["total_seconds"] = _read_json(path).get("total_seconds")
        with open(path, "w") as f:
            json.dump(table, f, indent=2, allow_nan=True)
    else:
        enable_compilation_cache(
            os.path.join(os.path.dirname(os.path.abspath(out_dir)), ".jax_cache")
        )
        table = run_comparison(
            F.task,
            out_dir=out_dir,
            estimators=estimators,
            seeds=seeds,
            quick=F.quick,
            sft_dir=sft_dir,
            force=F.force,
            overrides=overrides,
            window=1 if F.quick else F.window,
            variant=F.variant,
        )
    print(markdown(table))
    print(f"plots: {table['plots']}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
