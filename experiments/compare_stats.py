"""Statistics of an estimator study: AUC, paired differences with CIs, verdicts.

Pure NumPy (and SciPy's t quantile) on the per-seed records that compare_report
loads (estimator -> seed -> step -> metrics). Same seed = same warm start, prompt
order and sampling key for every estimator, so differences are paired by seed.

The CI of the mean paired difference is Student's t interval over seeds
(`t_ci`); a verdict needs at least `MIN_SEEDS` seeds. The percentile bootstrap
over seeds (`bootstrap_ci`, a fixed RNG seed) is reported beside it: it was the
rule of the studies committed before, and at 10 seeds its "95 %" interval covers
about 90 % (it is a z interval with a ddof=0 spread), so a verdict that differs
between the two is flagged. A study tests several predictions at 95 % each; the
family-wise verdict (`holm`: Holm's step-down adjustment of the t tests' p-values
over a study's predictions) keeps the chance of any false "held" or "did not
hold" among them at 5 %.

    from experiments.compare_stats import auc, t_ci
    auc([0, 10, 20], [0.1, 0.3, 0.5])       # 0.3: the curve's mean height
    t_ci([0.1, 0.2, -0.05, 0.15])           # (lo, hi) of the mean
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

Runs = dict[str, dict[int, dict[int, dict]]]


def auc(steps: Sequence[float], values: Sequence[float]) -> float:
    """Normalised area under a learning curve: trapezoid area / step range.

    The mean height of the curve over the steps it covers, in the metric's own
    units (so it reads like the metric). A non-finite value inside the curve is
    dropped (the trapezoid bridges it); one at the first or last step gives NaN, as
    does no point: dropped, it normalised over a shorter range, so a run whose final
    eval was NaN passed for a whole one (as NaN, the seed leaves `n`). One point
    gives that value.
    """
    s = np.asarray(steps, np.float64)
    v = np.asarray(values, np.float64)
    keep = np.isfinite(s)
    s, v = s[keep], v[keep]
    if not s.size:
        return math.nan
    order = np.argsort(s, kind="stable")
    s, v = s[order], v[order]
    if not (np.isfinite(v[0]) and np.isfinite(v[-1])):
        return math.nan
    s, v = s[np.isfinite(v)], v[np.isfinite(v)]
    if s.size == 1 or s[-1] == s[0]:
        return float(v.mean())
    area = float(np.sum((v[1:] + v[:-1]) * np.diff(s)) / 2.0)
    return area / float(s[-1] - s[0])


# Fewer seeds than this give no verdict: one seed's interval has no width to speak of
# (any positive difference "held"), two seeds' bootstrap is just [min, max].
MIN_SEEDS = 3


def _finite(values: Sequence[float]) -> np.ndarray:
    return np.asarray([x for x in values if x is not None and math.isfinite(x)], np.float64)


def t_ci(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float]:
    """Student's t CI of the mean of `values` (non-finite ones dropped): mean +- t *
    sd(ddof=1) / sqrt(n). Returns (nan, nan) for no values; (-inf, inf) for one."""
    from scipy import stats

    v = _finite(values)
    if not v.size:
        return math.nan, math.nan
    if v.size == 1:
        return -math.inf, math.inf
    half = stats.t.ppf(0.5 + level / 2.0, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean() - half), float(v.mean() + half)


def t_pvalue(values: Sequence[float], margin: float = 0.0) -> float:
    """Two-sided p-value of Student's one-sample t test that the mean of `values`
    (non-finite ones dropped) equals `margin`: below 0.05 exactly when `t_ci`'s 95 %
    interval excludes `margin`. NaN for fewer than two values; 0 for a spread of 0
    away from `margin` (1 at it)."""
    from scipy import stats

    v = _finite(values)
    if v.size < 2:
        return math.nan
    sd = float(v.std(ddof=1))
    if sd == 0.0:
        return 1.0 if float(v.mean()) == margin else 0.0
    t = (float(v.mean()) - margin) / (sd / math.sqrt(v.size))
    return float(2.0 * stats.t.sf(abs(t), v.size - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: the i-th smallest of
    the m finite p-values times (m - i + 1), made non-decreasing, capped at 1. NaN
    stays NaN and does not count in m. Rejecting where the adjusted p < alpha keeps
    the family-wise error rate at alpha for any dependence between the tests."""
    p = np.asarray(pvalues, np.float64)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = idx.size
    running = 0.0
    for rank, i in enumerate(idx[np.argsort(p[idx], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * float(p[i])))
        out[i] = running
    return out.tolist()


def format_p(p: float) -> str:
    """A p-value for a table: 3 significant digits, '<0.001' below, 'n/a' for NaN."""
    if not math.isfinite(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3g}"


def bootstrap_ci(
    values: Sequence[float], *, level: float = 0.95, n_boot: int = 10000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values` (non-finite ones dropped).

    Returns (nan, nan) for no values; (-inf, inf) for one (it has no spread to
    resample). Below ~20 values it covers less than `level` (about 90 % for a
    nominal 95 % at 10 normal values): `t_ci` is the verdicts' interval.
    """
    v = _finite(values)
    if not v.size:
        return math.nan, math.nan
    if v.size == 1:
        return -math.inf, math.inf
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def interval(d: Sequence[float], seeds: Sequence[int]) -> dict[str, Any]:
    """n, mean, the 95 % t CI (ci_lo, ci_hi) and bootstrap CI (boot_lo, boot_hi) of
    per-seed values `d`."""
    lo, hi = t_ci(d)
    boot_lo, boot_hi = bootstrap_ci(d)
    return {
        "n": len(d),
        "mean": float(np.mean(d)) if len(d) else math.nan,
        "ci_lo": lo,
        "ci_hi": hi,
        "boot_lo": boot_lo,
        "boot_hi": boot_hi,
        "seeds": list(seeds),
        "values": [float(x) for x in d],
    }


def paired(a: dict[int, float], b: dict[int, float]) -> dict[str, Any]:
    """Mean of a[seed] - b[seed] over the seeds both have, with its 95 % CIs (`interval`)."""
    common = sorted(s for s in set(a) & set(b) if math.isfinite(a[s]) and math.isfinite(b[s]))
    return interval([float(a[s] - b[s]) for s in common], common)


def verdict(diff: dict[str, Any], direction: int = 1, *, ci: str = "ci") -> str:
    """'held': CI of direction * diff above 0; 'did not hold': below 0; else 'inconclusive'.

    ci: "ci" (the t interval) or "boot" (the bootstrap's, `boot_lo` / `boot_hi`).
    Fewer than MIN_SEEDS seeds: 'inconclusive (n<3)'.
    """
    if not diff.get("n"):
        return "inconclusive (no runs)"
    if diff["n"] < MIN_SEEDS:
        return f"inconclusive (n<{MIN_SEEDS})"
    diff = {"ci_lo": diff[f"{ci}_lo"], "ci_hi": diff[f"{ci}_hi"]}
    lo, hi = diff["ci_lo"] * direction, diff["ci_hi"] * direction
    lo, hi = min(lo, hi), max(lo, hi)
    if lo > 0:
        return "held"
    if hi < 0:
        return "did not hold"
    return "inconclusive"


def per_seed(runs: Runs, est: str, fn) -> dict[int, float]:
    """seed -> fn(step -> record) for one estimator's runs."""
    return {seed: float(fn(recs)) for seed, recs in runs.get(est, {}).items()}


def curve_auc(recs: dict[int, dict], key: str, *, min_step: int = 0) -> float:
    """AUC of `key` over the steps of one run that log it (steps >= min_step)."""
    pts = [(s, r[key]) for s, r in sorted(recs.items()) if key in r and s >= min_step]
    return auc([p[0] for p in pts], [p[1] for p in pts])


def final_value(recs: dict[int, dict], key: str) -> float:
    """The value of `key` at the last step that logs it (NaN if none)."""
    steps = [s for s, r in recs.items() if key in r]
    return float(recs[max(steps)][key]) if steps else math.nan


def mean_over_steps(recs: dict[int, dict], key: str, *, first: int = 0, last: int = 0) -> float:
    """Mean of `key` over the steps in [first, last] (last 0 = all) that log it."""
    v = [
        r[key]
        for s, r in recs.items()
        if key in r and s >= first and (not last or s <= last) and math.isfinite(r[key])
    ]
    return float(np.mean(v)) if v else math.nan


def summarise(values: dict[int, float]) -> dict[str, Any]:
    """Median, IQR and mean over seeds of a seed -> value dict."""
    v = np.asarray([x for x in values.values() if math.isfinite(x)], np.float64)
    if not v.size:
        return {"n": 0}
    q25, med, q75 = np.percentile(v, [25, 50, 75])
    return {
        "n": int(v.size),
        "mean": float(v.mean()),
        "median": float(med),
        "q25": float(q25),
        "q75": float(q75),
    }


def study_stats(
    runs: Runs,
    *,
    eval_keys: Sequence[str],
    reward_names: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    early_steps: int = 10,
) -> dict[str, Any]:
    """Per estimator and per pair (a, b): finals, AUCs and share diagnostics, paired by seed.

    Quantities per run (seed):
      init:<key>        held-out `key` at step 0 (before RL);
      final:<key>       held-out `key` after the last step;
      auc:<key>         normalised AUC of held-out `key` over its eval steps (0 = warm start);
      train_auc:<name>  normalised AUC of the training reward/<name>/mean curve;
      share:<name>      mean of adv/share/<name> over all steps;
      share_early:<name> the same over steps 1..early_steps (the start, where it matters).
    Returns {"per_estimator": {est: {quantity: summary}},
             "paired": {"a-b": {quantity: paired diff}}, "quantities": [...]}.
    """
    fns = {}
    for k in eval_keys:
        fns[f"init:{k}"] = lambda r, k=k: r.get(0, {}).get(k, math.nan)
        fns[f"final:{k}"] = lambda r, k=k: final_value(r, k)
        fns[f"auc:{k}"] = lambda r, k=k: curve_auc(r, k)
    for n in reward_names:
        fns[f"train_auc:{n}"] = lambda r, n=n: curve_auc(r, f"reward/{n}/mean", min_step=1)
        fns[f"share:{n}"] = lambda r, n=n: mean_over_steps(r, f"adv/share/{n}", first=1)
        fns[f"share_early:{n}"] = lambda r, n=n: mean_over_steps(
            r, f"adv/share/{n}", first=1, last=early_steps
        )
    values = {est: {q: per_seed(runs, est, fn) for q, fn in fns.items()} for est in runs}
    out: dict[str, Any] = {"quantities": list(fns), "per_estimator": {}, "paired": {}}
    for est, qs in values.items():
        out["per_estimator"][est] = {q: summarise(v) for q, v in qs.items()}
    for a, b in pairs:
        if a in values and b in values:
            out["paired"][f"{a}-{b}"] = {q: paired(values[a][q], values[b][q]) for q in fns}
    out["values"] = values
    return out


def contrast(values: dict[str, dict[str, dict[int, float]]], terms) -> dict[str, Any]:
    """Per seed sum_i coef_i * values[est_i][quantity_i][seed], its mean and 95 % CIs.

    terms: [(coef, estimator, quantity)]; seeds missing from any term are left out.
    """
    seeds: set[int] | None = None
    for _, est, q in terms:
        have = {s for s, v in values.get(est, {}).get(q, {}).items() if math.isfinite(v)}
        seeds = have if seeds is None else seeds & have
    seeds = sorted(seeds or ())
    return interval([sum(c * values[est][q][s] for c, est, q in terms) for s in seeds], seeds)


def _all_of(parts: list[str]) -> str:
    if parts and all(v == "held" for v in parts):
        return "held"
    if any(v == "did not hold" for v in parts):
        return "did not hold"
    return "inconclusive"


def judge(values: dict[str, dict[str, dict[int, float]]], predictions) -> list[dict[str, Any]]:
    """Each prediction's contrast and verdict: 'held' when its 95 % t CI lies above
    `margin` (`verdict`); `verdict_bootstrap` is the same under the bootstrap CI;
    `verdict_holm` the same at a family-wise 5 % over the predictions with terms
    (`p_value`: the t test against the margin, `p_holm`: Holm-adjusted, `holm`).

    predictions: [{"id", "text", "terms": [(coef, est, quantity)], "margin": float}]; a
    prediction with "all_of": [ids] (earlier ones) holds when all of those held, fails
    when any failed. An id it names that is not earlier is a ValueError (a typo made
    it hold on its other parts alone).
    """
    out, by_id = [], {}
    for p in predictions:
        if "all_of" in p:
            unknown = [i for i in p["all_of"] if i not in by_id]
            if unknown:
                raise ValueError(
                    f"prediction {p['id']}: all_of names {unknown}, not among the predictions "
                    f"before it ({list(by_id)})."
                )
            res = {"id": p["id"], "text": p["text"], "all_of": p["all_of"]}
        else:
            c = contrast(values, p["terms"])
            m = p.get("margin", 0.0)
            shifted = dict(c, **{k: c[k] - m for k in ("ci_lo", "ci_hi", "boot_lo", "boot_hi")})
            res = dict(
                p,
                **c,
                p_value=t_pvalue(c["values"], m),
                verdict=verdict(shifted),
                verdict_bootstrap=verdict(shifted, ci="boot"),
            )
        by_id[p["id"]] = res
        out.append(res)
    leaves = [r for r in out if "all_of" not in r]
    for r, adjusted in zip(leaves, holm([r["p_value"] for r in leaves]), strict=True):
        r["p_holm"] = adjusted
        r["verdict_holm"] = _tested(r, adjusted)
    for r in out:  # in order: an all_of names earlier predictions only
        if "all_of" in r:
            for key in ("verdict", "verdict_bootstrap", "verdict_holm"):
                r[key] = _all_of([by_id[i][key] for i in r["all_of"]])
    return out


def _tested(res: dict[str, Any], p: float, alpha: float = 0.05) -> str:
    """`verdict`'s words for a test of the contrast against its margin at p."""
    if res["n"] < MIN_SEEDS:  # the words verdict() gives (no runs / n<3)
        return res["verdict"]
    if not p < alpha:
        return "inconclusive"
    return "held" if res["mean"] > res.get("margin", 0.0) else "did not hold"
