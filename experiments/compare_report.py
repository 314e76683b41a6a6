"""compare_estimators' report: plots, results.md and results.json from the runs on disk.

from experiments.compare_report import report
table = report("toolcall", "runs/replica/toolcall", ["grpo", "gdpo"], range(5))
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments.studies import STUDIES
from gdpo_jax.errors import ConfigError
from gdpo_jax.train.plots import LABELS, eval_plot_name, plot

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
TABLE["format_cold"] = TABLE["toolcall"]
TABLE["format_cold_toy"] = [
    ("eval/toy_correct_pm3", "correctness [-3,3]"),
    ("eval/format", "format"),
    ("eval/exact", "exact"),
    ("eval/len_mean", "length (tokens)"),
]
STUDY_TASKS = tuple(STUDIES)  # these get study_report's section
TABLE["three_binary"] = [
    ("eval/three_correct", "correct (rarest)"),
    ("eval/three_short", "short"),
    ("eval/three_marker", "marker"),
    ("eval/all", "all three"),
]


def load_runs(
    out_dir: str, estimators: Sequence[str], seeds: Sequence[int]
) -> dict[str, dict[int, dict[int, dict]]]:
    """estimator -> seed -> step -> record, for the finished runs (their metrics.jsonl)."""
    from gdpo_jax.train.metrics import read_jsonl

    runs: dict[str, dict[int, dict[int, dict]]] = {}
    for est in estimators:
        for seed in seeds:
            path = os.path.join(out_dir, "runs", est, f"seed{seed}", "metrics.jsonl")
            # Finished: a readable run_info.json (one cut by a kill is an unfinished run).
            if read_json_or_none(os.path.join(os.path.dirname(path), "run_info.json")) is not None:
                runs.setdefault(est, {})[seed] = read_jsonl(path)
    return runs


def _read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def read_json_or_none(path: str) -> dict | None:
    """The JSON object in `path`; None when it is missing, cut short or not an object
    (a kill mid-write under older versions left an empty run_info.json or results.json,
    and every later call died parsing it)."""
    try:
        with open(path) as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def write_json(path: str, obj: Any) -> None:
    """json.dump to `path` atomically (tmp + os.replace): a kill leaves the old file or
    the new one, never half of one."""
    write_text(path, json.dumps(obj, indent=2, allow_nan=True))


def write_text(path: str, text: str) -> None:
    """`text` into `path` atomically (tmp + os.replace)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


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
        # A seed without the metric (an older run reused by --report_only) stays NaN.
        "values": [math.nan if x is None else float(x) for x in values],
    }


def run_times(infos: list[dict]) -> dict[str, list]:
    """Per-run wall and CPU seconds from the runs' run_info.json; None for a resumed run.

    A resumed run's clock covers its last attempt only (the killed attempts' time
    is not recorded): counted, its minutes passed for a whole run's.
    """
    whole = [not i.get("resumed_from") for i in infos]
    return {
        "wall_s": [i["seconds"] if w else None for i, w in zip(infos, whole)],
        "cpu_s": [i.get("cpu_s") if w else None for i, w in zip(infos, whole)],
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
    """Plots and results.md from the runs on disk. Returns the table dict.

    Raises ConfigError, before writing anything, when the finished runs end at
    different steps (a shorter run's last values would count as final)."""
    runs = load_runs(out_dir, estimators, seeds)
    ends = {(est, seed): max(recs) for est, r in runs.items() for seed, recs in r.items() if recs}
    if len(set(ends.values())) > 1:
        last = max(ends.values())
        short = ", ".join(f"{e} seed {s} at step {t}" for (e, s), t in ends.items() if t < last)
        raise ConfigError(
            f"{out_dir}: the finished runs end at different steps ({short}; the others at "
            f"{last}); their final values are not comparable. Rerun those with --force, or "
            "report on runs of one length."
        )
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
        path = os.path.join(plots_dir, eval_plot_name(key))
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
        timing[est] = run_times([i for i in map(read_json_or_none, infos) if i is not None])
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
    if task in STUDY_TASKS:
        from experiments.study_report import study_section

        table["study"] = study_section(task, runs, metrics, plots_dir, window=window)
        plots += table["study"]["plots"]
    write_text(os.path.join(out_dir, "results.md"), markdown(table))
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
    text = "\n".join(lines) + "\n"
    if table.get("study"):
        from experiments.study_report import study_markdown

        text += study_markdown(table["study"])
    return text
