"""summary.md: one row of headline ratios per machine kind, and their range over kinds.

``run_all`` writes each machine kind's latest full run to ``machines/<kind>.json``;
this module reads those files (not ``machines/legacy/``) into one row each
(`headline`: the RL iteration and step against TRL, the sampler against
``generate()``, the advantages against NumPy, the matmul libraries' ratios) and
renders ``summary.md`` (`summary_markdown`), marking ratios measured against a TRL
that recomputed its layers (†) or while other processes loaded the machine (‡).
README and the docs quote its ranges (tests/test_docs.py checks them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks import common


# --------------------------------------------------------------------------- #
# One row per machine kind: the headline ratios (the reference's seconds / ours, > 1 = ours faster)
# --------------------------------------------------------------------------- #
def _run_dates(report: Mapping[str, Any]) -> str:
    """The full run's date, then the later `--only` updates' by date: "2026-12-04
    (bench_sampler 2026-12-05)", so a row's ratios are dated by the runs that measured
    them: each benchmark by the last run that merged it (an update whose entries later
    runs replaced is left out, and so is the full run's date when nothing of it is
    left). Updates on the full run's own date add nothing to it and are left out."""
    first = report["created"][:10]
    dated = dict.fromkeys(report["benchmarks"], first)
    for u in report.get("updates", []):
        dated.update(dict.fromkeys(u["benchmarks"], u["created"][:10]))
    by_date: dict[str, list[str]] = {}
    for u in report.get("updates", []):
        d = u["created"][:10]
        names = by_date.setdefault(d, [])
        names += [b for b in u["benchmarks"] if b not in names and dated.get(b) == d]
    later = [f"{', '.join(names)} {d}" for d, names in by_date.items() if d != first and names]
    if first not in dated.values():
        return "; ".join(later)
    return first + (f" ({'; '.join(later)})" if later else "")


def headline(report: Mapping[str, Any]) -> dict[str, Any]:
    """The ratios README and docs quote, from one run's report (None where a
    benchmark did not run or failed)."""
    b = report["benchmarks"]

    def res(name: str) -> Any:
        rec = b.get(name, {})
        return rec.get("result") if rec.get("status") == "ok" else None

    row: dict[str, Any] = {
        "machine": common.machine_kind(report["machine"]),
        "cpu": report["machine"]["cpu_model"],
        "cores": report["machine"]["cpu_usable"],
        "run": _run_dates(report),
    }
    rl = res("bench_rl")
    # Runs before the field: TRL's default gradient checkpointing re-ran its layers in the
    # backward (ours does not), so their TRL ratios are overstated.
    row["trl_recomputed"] = bool(rl) and rl.get("config", {}).get(
        "trl_gradient_checkpointing", True
    )
    for beta in ("0.0", "0.04"):
        r = rl["results"].get(f"beta={beta}") if rl else None
        row[f"rl_iter_b{beta}"] = r["speedup_iter"] if r else None
        row[f"rl_step_b{beta}"] = r["speedup_step"] if r else None
    sampler = res("bench_sampler")
    for mode, key in (("greedy", "greedy"), ("sampled", "sampled"), ("top-k 50", "top_k")):
        r = [x for x in (sampler or {}).get("results", []) if x.get("mode") == mode]
        row[f"sampler_{key}"] = r[0]["speedup"] if r else None
    adv = res("bench_advantages")
    r = [x for x in (adv or {}).get("results", []) if x.get("estimator") == "gdpo"]
    row["advantages_gdpo"] = r[0]["speedup"] if r else None
    fams = (res("bench_matmul") or {}).get("families", {})
    row["matmul_step"], row["matmul_decode"] = fams.get("step"), fams.get("decode")
    row["matmul_decode_chain"] = fams.get("decode chain")
    row["matmul_decode_glue"] = fams.get("decode chain, with glue")
    # Benchmarks that ran beside other work (their ratios are marked ‡).
    row["loaded"] = sorted(
        name
        for name, rec in b.items()
        if rec.get("status") == "ok"
        and (rec.get("host", {}).get("other_cpu_frac") or 0.0) > common.LOADED_FRAC
    )
    return row


HEADLINE_COLUMNS = {
    "rl_iter_b0.0": "RL iteration vs TRL, beta 0",
    "rl_iter_b0.04": "RL iteration vs TRL, beta 0.04",
    "rl_step_b0.0": "step vs TRL's, beta 0",
    "rl_step_b0.04": "step vs TRL's, beta 0.04",
    "sampler_greedy": "sampler vs generate(), greedy",
    "sampler_sampled": "sampler vs generate(), sampled",
    "sampler_top_k": "sampler vs generate(), top-k 50",
    "advantages_gdpo": "GDPO advantages vs NumPy",
    # Not a speed-up of ours: the matmul library's, which bounds the ratios above.
    "matmul_step": "XLA matmuls vs PyTorch's, step shapes",
    "matmul_decode": "XLA matmuls vs PyTorch's, decode shapes",
    "matmul_decode_chain": "XLA matmuls vs PyTorch's, a decode step's chained",
    "matmul_decode_glue": "XLA vs PyTorch, a decode step's matmuls with their glue",
}


# Retired rows (a kind recorded before its vector ISA was, an old timing method) move
# here: kept for the record, out of the summary and so out of the README's ranges.
LEGACY_DIR = "legacy"


def summary_rows(machines_dir: str) -> list[dict[str, Any]]:
    """headline() of every CPU machines/<kind>.json, sorted by kind (files directly in
    machines_dir only: not LEGACY_DIR's). A GPU kind's file (its own table in
    machines/) is left out: its ratios (6.3x the RL iteration on an H200) entered the
    CPU ranges that README quotes."""
    rows = []
    if os.path.isdir(machines_dir):
        for name in sorted(os.listdir(machines_dir)):
            path = os.path.join(machines_dir, name)
            if name.endswith(".json") and os.path.isfile(path):
                with open(path) as f:
                    report = json.load(f)
                if report["machine"].get("backend", "cpu") == "cpu":
                    rows.append(headline(report))
    return rows


def ratio_range(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[float, float] | None:
    """(min, max) of one headline ratio over machine kinds (None: never measured)."""
    vals = [r[key] for r in rows if r.get(key) is not None]
    return (min(vals), max(vals)) if vals else None


def summary_markdown(machines_dir: str) -> str:
    """summary.md: one row per machine kind, then the range of each ratio over kinds."""
    rows = summary_rows(machines_dir)
    lines = [
        "# Benchmark ratios per machine kind",
        "",
        "Written by `python -m benchmarks.run_all` from `machines/*.json` (one full run per "
        "machine kind, the latest). Ratios are the reference's seconds over ours: above 1, "
        "ours is faster. The matmul columns are the matmul libraries' ratio alone "
        "(bench_matmul: XLA's and PyTorch's products at the step's and the decode's shapes, "
        "each alone; a decode step's products chained, XLA in one compiled loop as the "
        "sampler runs them and PyTorch eagerly as generate() does; the same with the norms "
        "and adds between them), which bounds the step's and the sampler's. Details per "
        "machine: `machines/<kind>.md`. Rows are of different dates (each row's run); "
        "retired rows are kept in `machines/legacy/`, not summarised.",
        "",
    ]
    table = [
        {"machine": r["machine"], "CPU": r["cpu"], "cores": r["cores"], "run": r["run"]}
        | {
            label: _fmt_ratio(r[k])
            + ("†" if r.get("trl_recomputed") and k in _TRL else "")
            + ("‡" if r[k] is not None and _SOURCE[k] in r.get("loaded", ()) else "")
            for k, label in HEADLINE_COLUMNS.items()
        }
        for r in rows
    ]
    lines += [common.markdown_table(table)]
    if any(r.get("trl_recomputed") for r in rows):
        lines += [
            "",
            "† Measured against a TRL that re-ran its decoder layers in the backward "
            "(gradient checkpointing, TRL 1.16's default; ours does not): a second forward "
            "of every layer in TRL's backward, so these TRL ratios are overstated. bench_rl "
            "turns it off since 2026-12-05; a kind's next run measures the same work on both "
            "sides.",
        ]
    if any(r.get("loaded") for r in rows):
        lines += [
            "",
            f"‡ Measured while other processes used more than {common.LOADED_FRAC:.0%} of the "
            "cores' time (the machine file's summary gives the share): not comparable with "
            "a quiet run's.",
        ]
    lines += ["", "Range over machine kinds:", ""]
    rng = [
        {
            "ratio": label,
            "min": _fmt_ratio(mm[0]),
            "max": _fmt_ratio(mm[1]),
            "machines": n,
            "of them †": sum(bool(r.get("trl_recomputed")) for r in rows if r[k] is not None)
            if k in _TRL
            else "",
        }
        for k, label in HEADLINE_COLUMNS.items()
        if (mm := ratio_range(rows, k)) is not None
        for n in [sum(r[k] is not None for r in rows)]
    ]
    lines += [common.markdown_table(rng), ""]
    return "\n".join(lines)


# The columns of bench_rl's ratios to TRL.
_TRL = ("rl_iter_b0.0", "rl_iter_b0.04", "rl_step_b0.0", "rl_step_b0.04")
# The benchmark each headline column comes from.
_SOURCE = {
    k: "bench_rl"
    if k.startswith("rl_")
    else "bench_sampler"
    if k.startswith("sampler_")
    else "bench_advantages"
    if k.startswith("advantages_")
    else "bench_matmul"
    for k in HEADLINE_COLUMNS
}


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"
