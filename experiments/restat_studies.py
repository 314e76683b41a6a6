"""Re-judges the committed studies from their results.json, under both intervals.

Each study's `docs/results/<study>/results.json` keeps every quantity's per-seed
values (`study.stats.values`) and every run's wall and CPU time. This script runs
the predictions (experiments/study_predictions.py) through
`compare_stats.judge` again: the verdict under Student's t interval, the one the
reports use now, beside the verdict under the percentile bootstrap, the rule the
studies were committed with (at 10 seeds its nominal 95 % covers about 90 %). It
writes `verdicts.md` and `verdicts.json` (one table of verdicts, one of per-run
times) to --out_dir; docs/results holds the committed ones, and
tests/test_compare_estimators.py checks that they are current.

    python -m experiments.restat_studies --results_dir=docs/results --out_dir=docs/results
"""

from __future__ import annotations

import json
import math
import os
import statistics
from typing import Any

from absl import app, flags

from experiments.compare_stats import format_p, judge
from experiments.study_predictions import PREDICTIONS
from gdpo_jax.train import cli


def _values(stats: dict) -> dict[str, dict[str, dict[int, float]]]:
    """results.json's est -> quantity -> seed (a JSON string key) -> value, seeds as ints."""
    return {
        est: {q: {int(s): float(v) for s, v in seeds.items()} for q, seeds in qs.items()}
        for est, qs in stats["values"].items()
    }


def restat(results_dir: str) -> dict[str, Any]:
    """{"verdicts": [one row per prediction of each study], "timing": [one row per study]}."""
    verdicts, timing = [], []
    for study in sorted(os.listdir(results_dir)):
        path = os.path.join(results_dir, study, "results.json")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            try:
                saved = json.load(f)
            except ValueError as e:  # cut by a kill: a traceback that named no file
                raise ValueError(
                    f"{path} is not JSON ({e}); rewrite it with the study's "
                    "`python -m experiments.compare_estimators --study=... --report_only`."
                ) from None
        if "study" not in saved:
            continue
        name = saved["task"]
        for p in judge(_values(saved["study"]["stats"]), PREDICTIONS[name]):
            row = {"study": study, "id": p["id"], "text": p["text"]}
            row.update({k: p[k] for k in ("verdict", "verdict_holm", "verdict_bootstrap")})
            if "all_of" in p:
                row["all_of"] = p["all_of"]
            else:
                keys = ("n", "mean", "ci_lo", "ci_hi", "p_value", "p_holm", "boot_lo", "boot_hi")
                row.update({k: p[k] for k in keys})
                row["margin"] = p.get("margin", 0.0)
            verdicts.append(row)
        # None: a resumed run, whose clock covers its last attempt only.
        wall = [x for t in saved["timing"].values() for x in t["wall_s"] if x is not None]
        cpu = [x for t in saved["timing"].values() for x in t["cpu_s"] if x is not None]
        timing.append(
            {"study": study, "runs": len(wall), "wall_s": _span(wall), "cpu_s": _span(cpu)}
        )
    return {"verdicts": verdicts, "timing": timing}


def _span(v: list[float]) -> dict[str, float]:
    if not v:
        return {"min": math.nan, "median": math.nan, "max": math.nan}
    return {"min": min(v), "median": statistics.median(v), "max": max(v)}


def _ci(lo: float, hi: float) -> str:
    return f"[{lo:+.3f}, {hi:+.3f}]"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# The committed studies' verdicts, re-judged",
        "",
        "Written by `python -m experiments.restat_studies` from each study's `results.json`",
        "(per-seed values; nothing re-run). Verdict: the 95 % t interval over seeds, the rule",
        "of the reports now; bootstrap: the 95 % percentile bootstrap over seeds, the rule the",
        "studies were committed with in their `predictions.md` (at 10 seeds it covers about",
        "90 %). **differs** marks a verdict the two intervals do not share. Family-wise: each",
        "study's t tests (p against the margin) with Holm's step-down adjustment over its",
        "predictions, which keeps the chance of any false held / did-not-hold among them at 5 %.",
        "",
        "| study | id | mean (n) | t CI | p | verdict | Holm p | family-wise verdict "
        "| bootstrap CI | bootstrap verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["verdicts"]:
        flag = " **differs**" if r["verdict"] != r["verdict_bootstrap"] else ""
        if "all_of" in r:
            num, t, b, p, ph = "+".join(r["all_of"]), "", "", "", ""
        else:
            margin = f", margin {r['margin']:+g}" if r["margin"] else ""
            num = f"{r['mean']:+.3f} (n={r['n']}){margin}"
            t, b = _ci(r["ci_lo"], r["ci_hi"]), _ci(r["boot_lo"], r["boot_hi"])
            p, ph = format_p(r["p_value"]), format_p(r["p_holm"])
        lines.append(
            f"| {r['study']} | {r['id']} | {num} | {t} | {p} | {r['verdict']} | {ph} | "
            f"{r['verdict_holm']} | {b} | {r['verdict_bootstrap']}{flag} |"
        )
    lines += [
        "",
        "## Time per run (from `run_info.json`, all estimators and seeds)",
        "",
        "| study | runs | wall s: min / median / max | CPU s: min / median / max |",
        "|---|---|---|---|",
    ]
    for t in result["timing"]:
        w, c = t["wall_s"], t["cpu_s"]
        lines.append(
            f"| {t['study']} | {t['runs']} | {w['min']:.1f} / {w['median']:.1f} / {w['max']:.1f}"
            f" | {c['min']:.1f} / {c['median']:.1f} / {c['max']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def write(results_dir: str, out_dir: str) -> dict[str, Any]:
    """Re-judges the studies under `results_dir` into `out_dir`'s verdicts.md / .json.

    Raises a ValueError, before writing, when `results_dir` is missing or holds no
    study: empty tables replaced the committed verdicts (--out_dir's default).
    """
    if not os.path.isdir(results_dir):
        raise ValueError(f"--results_dir={results_dir} is not a directory of study folders.")
    result = restat(results_dir)
    if not result["verdicts"]:
        raise ValueError(
            f"--results_dir={results_dir} holds no study (<study>/results.json with a 'study' "
            "section); point it at the committed studies, e.g. docs/results."
        )
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "verdicts.md"), "w") as f:
        f.write(markdown(result))
    with open(os.path.join(out_dir, "verdicts.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def main(argv: list[str]) -> None:
    del argv
    f = flags.FLAGS
    try:
        result = write(f.results_dir, f.out_dir)
    except ValueError as e:
        cli.fail(e)
    differ = sum(r["verdict"] != r["verdict_bootstrap"] for r in result["verdicts"])
    print(
        f"{len(result['verdicts'])} predictions of {len(result['timing'])} studies re-judged "
        f"({differ} verdicts differ between the intervals): "
        f"{os.path.join(f.out_dir, 'verdicts.md')}"
    )


def run() -> None:
    flags.DEFINE_string("results_dir", "docs/results", "committed study folders")
    flags.DEFINE_string("out_dir", "docs/results", "where verdicts.md / verdicts.json go")
    app.run(main)


if __name__ == "__main__":
    run()
