"""The study part of a comparison report (issue 16): share plots, AUCs, paired CIs, verdicts.

Called by compare_report.report for `--study=<name>` comparisons; appends to
results.md / results.json. Statistics: experiments/compare_stats.py;
predictions: experiments/study_predictions.py.
"""

from __future__ import annotations

import math
import os
from typing import Any

from experiments.compare_stats import MIN_SEEDS, format_p, judge, study_stats
from experiments.study_predictions import PREDICTIONS
from gdpo_jax.train.plots import LABELS, plot

PAIRS = (("gdpo", "grpo"), ("gdpo", "grpo_no_std"), ("grpo", "grpo_no_std"))


def reward_names(runs: dict) -> list[str]:
    """The rewards logged as reward/<name>/mean, in first-seen order."""
    names: list[str] = []
    for recs in runs.values():
        for r in recs.values():
            for rec in r.values():
                for k in rec:
                    if k.startswith("reward/") and k.endswith("/mean"):
                        n = k.split("/")[1]
                        if n not in names:
                            names.append(n)
    return names


def study_section(
    study: str, runs: dict, eval_keys: list[str], plots_dir: str, *, window: int = 5
) -> dict[str, Any]:
    """Share plots + statistics + prediction verdicts of one study's runs."""
    names = reward_names(runs)
    plots = []
    for n in names:
        path = os.path.join(plots_dir, f"share_{n}.png")
        title = f"{study}: adv/share/{n} ({window}-step moving avg.)\nmedian and IQR over seeds"
        if plot(runs, f"adv/share/{n}", path, window=window, title=title):
            plots.append(path)
    stats = study_stats(runs, eval_keys=eval_keys, reward_names=names, pairs=PAIRS)
    verdicts = judge(stats["values"], PREDICTIONS.get(study, []))
    return {"rewards": names, "plots": plots, "stats": stats, "predictions": verdicts}


def _fmt(x: float, signed: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def study_markdown(section: dict[str, Any]) -> str:
    """AUC / share table per estimator, paired differences with CIs, verdicts."""
    stats = section["stats"]
    quantities = [q for q in stats["quantities"] if not q.startswith("init:")]
    lines = [
        "",
        "## Per estimator: median [IQR] over seeds",
        "",
        "`final:` held-out after the last step; `auc:` normalised area under the held-out "
        "curve (steps 0..last); `train_auc:` the same for the per-step training reward; "
        "`share:` mean adv/share over steps (squared within-group correlation of the "
        "advantage with the reward); `share_early:` the same over steps 1-10.",
        "",
        "| quantity | " + " | ".join(LABELS.get(e, e) for e in stats["per_estimator"]) + " |",
        "|---" * (len(stats["per_estimator"]) + 1) + "|",
    ]
    for q in quantities:
        cells = []
        for est in stats["per_estimator"]:
            s = stats["per_estimator"][est][q]
            cells.append(
                f"{_fmt(s['median'])} [{_fmt(s['q25'])}, {_fmt(s['q75'])}] (n={s['n']})"
                if s.get("n")
                else "n/a"
            )
        lines.append(f"| {q} | " + " | ".join(cells) + " |")
    lines += ["", "## Paired differences (same seed): mean and 95 % t interval over seeds", ""]
    if not stats["paired"]:  # one estimator: an empty table read like a broken report
        lines.append("None: no pair of the study's estimators ran (one estimator).")
    else:
        lines += [
            "| quantity | " + " | ".join(stats["paired"]) + " |",
            "|---" * (len(stats["paired"]) + 1) + "|",
        ]
    for q in quantities if stats["paired"] else ():
        cells = []
        for pair in stats["paired"]:
            d = stats["paired"][pair][q]
            cells.append(
                f"{_fmt(d['mean'], True)} [{_fmt(d['ci_lo'], True)}, {_fmt(d['ci_hi'], True)}]"
                f" (n={d['n']})"
                if d["n"]
                else "n/a"
            )
        lines.append(f"| {q} | " + " | ".join(cells) + " |")
    if section["predictions"]:
        lines += [
            "",
            "## Predictions (predictions.md, committed before the runs)",
            "",
            "Verdict: the 95 % t interval over seeds (at least "
            f"{MIN_SEEDS} seeds); family-wise: the same t tests with Holm's adjustment over "
            "the study's predictions (5 % chance of any false verdict among them); under the "
            "percentile bootstrap, the rule of the studies committed before it, in the last "
            "column (it covers ~90 % at 10 seeds).",
            "",
            "| id | prediction | mean [95 % t CI] (n seeds) | verdict | family-wise: Holm p, "
            "verdict | bootstrap CI: verdict |",
            "|---|---|---|---|---|---|",
        ]
        for p in section["predictions"]:
            boot = p.get("verdict_bootstrap", "n/a")
            fam = p.get("verdict_holm", "n/a")
            if "all_of" in p:
                num = "+".join(p["all_of"])
            else:
                fam = f"{format_p(p.get('p_holm', math.nan))}, {fam}"
                margin = p.get("margin", 0.0)
                num = (
                    f"{_fmt(p['mean'], True)} [{_fmt(p['ci_lo'], True)}, "
                    f"{_fmt(p['ci_hi'], True)}] (n={p['n']})"
                    + (f", margin {margin:+g}" if margin else "")
                )
                boot = f"[{_fmt(p['boot_lo'], True)}, {_fmt(p['boot_hi'], True)}]: {boot}"
            flag = " (differs)" if p.get("verdict_bootstrap", p["verdict"]) != p["verdict"] else ""
            lines.append(
                f"| {p['id']} | {p['text']} | {num} | **{p['verdict']}** | {fam} | {boot}{flag} |"
            )
    return "\n".join(lines) + "\n"
