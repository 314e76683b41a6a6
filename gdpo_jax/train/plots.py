"""Training and held-out curves as PNG files, for one run or a comparison of runs.

`plot_run(workdir)` draws `<workdir>/plots/train_<reward>.png` (and
`eval_<metric>.png`) from `<workdir>/metrics.jsonl`; experiments/compare_estimators
draws the same figures with several estimators and seeds per panel (median
and inter-quartile band over seeds).
"""

from __future__ import annotations

import logging
import os
import warnings

import numpy as np

from gdpo_jax.train import paths

log = logging.getLogger("gdpo_jax.plots")

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

# runs[label][seed][step] = metrics record of that step.
Runs = dict[str, dict[int, dict[int, dict]]]


def curve(records: dict[int, dict], key: str, window: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of `key` over the steps that have it; trailing moving average
    over each window's finite values (a NaN step, e.g. a batch with no scorable row,
    leaves its window's other values standing; a window of NaN only is NaN). The window
    is `window` steps, (s - window, s], not records: with train.log_every = k it was k
    times the "N-step" its plots' titles say, and seeds logging other steps got windows
    of other lengths."""
    steps = np.asarray(sorted(s for s, r in records.items() if key in r), np.int64)
    vals = np.asarray([records[s][key] for s in steps], np.float64)
    if window > 1 and len(vals):
        ok = np.isfinite(vals)
        c = np.cumsum(np.insert(np.where(ok, vals, 0.0), 0, 0.0))
        n = np.cumsum(np.insert(ok.astype(np.int64), 0, 0))
        lo = np.searchsorted(steps, steps - window, side="right")
        count = n[1:] - n[lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            vals = np.where(count > 0, (c[1:] - c[lo]) / count, np.nan)
    return steps, vals


def band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """(steps, median, 25th, 75th percentile) over seeds, on the steps every seed has;
    a seed's NaN at a step (no scorable row) leaves the others' quantiles standing (it
    made the step's whole band NaN), and a step NaN in every seed is NaN."""
    common = sorted(set.intersection(*(set(s.tolist()) for s, _ in curves)))
    mat = np.stack([v[np.searchsorted(s, common)] for s, v in curves])
    with warnings.catch_warnings():  # "All-NaN slice": that step is NaN, as it should be
        warnings.simplefilter("ignore", RuntimeWarning)
        q25, med, q75 = np.nanpercentile(mat, [25, 50, 75], axis=0)
    return np.asarray(common), med, q25, q75


def plot(runs: Runs, key: str, path: str, *, title: str, window: int = 1) -> bool:
    """One figure: per run label, the median over seeds and the IQR band of `key`.

    Returns False (and writes nothing) when no run has `key`. `path` may be a URL
    (written through etils.epath).
    """
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
        if len(curves) > 1:
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
    with paths.open_file(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return True


def eval_plot_name(key: str) -> str:
    """'eval/pass@1' -> 'eval_passat1.png' (file-name safe)."""
    return f"eval_{key.split('/', 1)[1].replace('@', 'at').replace('/', '_')}.png"


def plot_run(workdir: str, *, label: str = "", window: int = 5) -> list[str]:
    """Draws `<workdir>/plots/train_<reward>.png` and `eval_<metric>.png` for one run.

    One panel per reward (`reward/<name>/mean`, a `window`-step moving average),
    one for `reward/total`, and one per held-out metric (`eval/*`). Returns the
    paths written; [] when the run has no metrics yet.
    """
    from gdpo_jax.train.metrics import read_jsonl

    metrics = paths.join(workdir, "metrics.jsonl")
    if not paths.exists(metrics):
        return []
    records = read_jsonl(metrics)
    if not records:
        return []
    runs: Runs = {label or "run": {0: records}}
    keys = sorted({k for r in records.values() for k, v in r.items() if _is_number(v)})
    out_dir = paths.join(workdir, "plots")
    paths.makedirs(out_dir)
    name = os.path.basename(str(workdir).rstrip("/"))
    written = []
    for key in keys:
        if key.startswith("reward/") and (key.endswith("/mean") or key == "reward/total"):
            reward = key.split("/")[1]
            path = paths.join(out_dir, f"train_{reward}.png")
            title = f"{name}: training {reward}, {window}-step moving avg."
            if plot(runs, key, path, title=title, window=window):
                written.append(path)
        elif key.startswith("eval/"):
            path = paths.join(out_dir, eval_plot_name(key))
            if plot(runs, key, path, title=f"{name}: held-out {key[5:]}"):
                written.append(path)
    return written


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
