"""experiments/compare_estimators.py: the --quick comparison end to end, and its statistics."""

import json
import math
import os
import shutil
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments import compare_estimators as ce  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_curve_moving_average_and_band_by_hand():
    recs = {1: {"r": 1.0}, 2: {"r": 3.0}, 3: {"r": 5.0}, 4: {"x": 0.0}, 5: {"r": 7.0}}
    steps, vals = ce.curve(recs, "r", window=2)
    np.testing.assert_array_equal(steps, [1, 2, 3, 5])
    # Trailing mean over the last 2 steps, (s - 2, s]: step 5's window holds step 4, which
    # logs no "r", and step 5 (by records it took step 3 too: 6.0).
    np.testing.assert_allclose(vals, [1.0, 2.0, 4.0, 7.0])
    # Logged every 10 steps: a 20-step window holds 2 records, a 10-step one 1 (by records,
    # a "10-step" average spanned 100 steps).
    recs = {s: {"r": float(s)} for s in range(10, 60, 10)}
    np.testing.assert_allclose(ce.curve(recs, "r", window=20)[1], [10, 15, 25, 35, 45])
    np.testing.assert_allclose(ce.curve(recs, "r", window=10)[1], [10, 20, 30, 40, 50])
    # A NaN step (no scorable row that batch) drops out of its windows only: a cumulative
    # sum carried it into every later point.
    recs = {s: {"r": v} for s, v in enumerate([1.0, 3.0, float("nan"), 5.0, 7.0, 9.0], 1)}
    _, vals = ce.curve(recs, "r", window=2)
    np.testing.assert_allclose(vals, [1.0, 2.0, 3.0, 5.0, 6.0, 8.0])
    _, vals = ce.curve({1: {"r": float("nan")}, 2: {"r": 4.0}}, "r", window=1)
    assert np.isnan(vals[0]) and vals[1] == 4.0  # no window: values as logged
    _, vals = ce.curve({1: {"r": float("nan")}, 2: {"r": float("nan")}}, "r", window=2)
    assert np.isnan(vals).all()
    # Three seeds; the band is over the steps all of them have (here 1 and 2).
    curves = [
        (np.array([1, 2]), np.array([0.0, 1.0])),
        (np.array([1, 2, 3]), np.array([2.0, 3.0, 9.0])),
        (np.array([1, 2]), np.array([4.0, 5.0])),
    ]
    steps, med, q25, q75 = ce.band(curves)
    np.testing.assert_array_equal(steps, [1, 2])
    np.testing.assert_allclose(med, [2.0, 3.0])
    np.testing.assert_allclose(q25, [1.0, 2.0])  # numpy's linear interpolation: 0 + 0.5 * 2
    np.testing.assert_allclose(q75, [3.0, 4.0])
    # One seed's NaN (a step without a scorable row) made the step's whole band NaN; the
    # other seeds' quantiles stand, and a step NaN in every seed stays NaN.
    nan = float("nan")
    curves = [
        (np.array([1, 2]), np.array([nan, nan])),
        (np.array([1, 2]), np.array([2.0, nan])),
        (np.array([1, 2]), np.array([4.0, nan])),
    ]
    _, med, q25, q75 = ce.band(curves)
    np.testing.assert_allclose([med[0], q25[0], q75[0]], [3.0, 2.5, 3.5])
    assert np.isnan([med[1], q25[1], q75[1]]).all()


def test_stats_by_hand():
    s = ce._stats([1.0, 2.0, 4.0, float("nan")])
    assert s["n"] == 3 and s["mean"] == pytest.approx(7 / 3) and s["median"] == 2.0
    assert s["std"] == pytest.approx(
        math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    )
    assert ce._stats([])["n"] == 0
    # A seed without the metric (an older run's records) stays NaN; float(None) raised.
    s = ce._stats([1.0, None, 3.0])
    assert s["n"] == 2 and s["mean"] == 2.0 and s["values"][::2] == [1.0, 3.0]
    assert math.isnan(s["values"][1])


def test_the_window_flag_is_kept_at_the_quick_size():
    # --size=quick --window=3 drew 1-step curves: the quick default overrode the flag.
    from experiments.compare_estimators import curve_window

    assert curve_window(3, given=True, quick=True) == 3
    assert curve_window(5, given=False, quick=True) == 1
    assert curve_window(5, given=False, quick=False) == 5


def test_run_config_changes_only_estimator_seed_and_workdir():
    from gdpo_jax.train.config import config_to_dict, validate_config

    a = ce.run_config(
        "toolcall", estimator="grpo", seed=0, workdir="/tmp/a", model="m", quick=False
    )
    b = ce.run_config(
        "toolcall", estimator="gdpo_no_bn", seed=3, workdir="/tmp/b", model="m", quick=False
    )
    da, db = config_to_dict(a), config_to_dict(b)
    diff = sorted(k for k in da if da[k] != db[k])
    assert diff == ["algo", "seed", "workdir"]
    assert {k for k in da["algo"] if da["algo"][k] != db["algo"][k]} == {"estimator"}
    for task in ("toolcall", "math"):
        for quick in (False, True):
            validate_config(
                ce.run_config(
                    task, estimator="gdpo", seed=0, workdir="/tmp/w", model="m", quick=quick
                ),
                num_devices=1,
            )
    m = ce.run_config("math", estimator="gdpo", seed=0, workdir="/tmp/w", model="m", quick=False)
    assert tuple(m.rewards.conditions) == ("", "math_correct")  # length gated on correctness
    plain = ce.run_config(
        "math", estimator="gdpo", seed=0, workdir="/tmp/w", model="m", quick=True, variant="plain"
    )
    assert tuple(plain.rewards.conditions) == ("", "")  # the paper's main math setting
    assert plain.train.num_steps == 2  # quick still applies
    with pytest.raises(ValueError, match="unknown option"):
        ce.run_config(
            "math",
            estimator="gdpo",
            seed=0,
            workdir="/tmp/w",
            model="m",
            quick=False,
            variant="plian",
        )
    o = ce.run_config(
        "toolcall",
        estimator="gdpo",
        seed=0,
        workdir="/tmp/w",
        model="m",
        quick=True,
        overrides={"train.num_steps": "3", "train.tensorboard": "true"},
    )
    assert o.train.num_steps == 3 and o.train.tensorboard is True


def test_quick_comparison_writes_metrics_plots_and_table(tmp_path):
    out = tmp_path / "cmp"
    table = ce.run_comparison(
        "toolcall", out_dir=str(out), estimators=["grpo", "gdpo"], seeds=[0], quick=True, window=1
    )
    from gdpo_jax.train.metrics import read_jsonl

    assert (out / "sft" / "hf" / "config.json").exists()
    for est in ("grpo", "gdpo"):
        run = out / "runs" / est / "seed0"
        recs = read_jsonl(str(run / "metrics.jsonl"))
        assert sorted(recs) == [0, 1, 2]
        assert {"eval/toolcall_format", "eval/toolcall_correctness", "eval/accuracy"} <= set(
            recs[0]
        )
        for step in (1, 2):
            for k in (
                "reward/toolcall_format/mean",
                "reward/toolcall_correctness/mean",
                "loss",
                "adv/std",
            ):
                assert math.isfinite(recs[step][k]), (est, step, k)
        assert "eval/accuracy" in recs[2]  # evaluated after the last step
        info = json.loads((run / "run_info.json").read_text())
        assert info["done"] and info["estimator"] == est and info["seconds"] > 0

    for name in (
        "train_toolcall_format",
        "train_toolcall_correctness",
        "eval_toolcall_correctness",
        "eval_accuracy",
        "eval_format",
    ):
        path = out / "plots" / f"{name}.png"
        assert path.read_bytes()[:8] == PNG_MAGIC, name

    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"].keys() == table["rows"].keys() == {"warm start (step 0)", "grpo", "gdpo"}
    for row in saved["rows"].values():
        for metric in ce.TABLE["toolcall"]:
            s = row[metric[0]]
            assert s["n"] >= 1
            assert all(math.isfinite(s[k]) for k in ("mean", "std", "median", "q25", "q75"))
    assert -3.0 <= saved["rows"]["gdpo"]["eval/toolcall_correctness"]["mean"] <= 3.0
    md = (out / "results.md").read_text().strip().splitlines()
    assert md[0].startswith("| estimator | correctness reward")
    assert md[3].startswith("| GRPO |") and md[4].startswith("| GDPO |")
    assert md[5] == "" and md[-1].startswith("| GDPO | ")  # then the paired table
    paired = saved["paired_vs_grpo"]["gdpo"]["eval/format"]
    assert paired["n"] == 1 and paired["mean"] == pytest.approx(
        saved["rows"]["gdpo"]["eval/format"]["mean"] - saved["rows"]["grpo"]["eval/format"]["mean"]
    )

    # A second call finds the runs done and only redraws the report.
    again = ce.run_comparison(
        "toolcall", out_dir=str(out), estimators=["grpo", "gdpo"], seeds=[0], quick=True, window=1
    )
    assert again["rows"] == table["rows"]

    # A run killed after step 1 (checkpoint written, no run_info.json) is resumed
    # by the next call and ends exactly like the uninterrupted one, step-0 eval kept.
    run = out / "runs" / "gdpo" / "seed0"
    full = read_jsonl(str(run / "metrics.jsonl"))
    shutil.rmtree(run)
    cfg = ce.run_config(
        "toolcall",
        estimator="gdpo",
        seed=0,
        workdir=str(run),
        model=str(out / "sft" / "hf"),
        quick=True,
    )
    cfg.train.stop_after_step = 1
    assert ce.run_one(cfg)["done"] is False
    assert not (run / "run_info.json").exists() and (run / "checkpoints").is_dir()
    assert sorted(read_jsonl(str(run / "metrics.jsonl"))) == [0, 1]
    # As if the attempt had run on (a longer num_steps) past its checkpoint and been
    # killed mid-write: the resumed run kept step 5, and the report read it as final.
    stale = dict(full[2], step=5)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps(stale) + "\n" + '{"step": 6, "ev')
    ce.run_comparison(
        "toolcall", out_dir=str(out), estimators=["grpo", "gdpo"], seeds=[0], quick=True, window=1
    )
    assert json.loads((run / "run_info.json").read_text())["resumed_from"] == 1
    assert not (run / "checkpoints").exists()  # removed once the run finished
    resumed = read_jsonl(str(run / "metrics.jsonl"))
    assert sorted(resumed) == [0, 1, 2]
    timing = ("time/", "perf/", "reward_time/")
    for step in (0, 1, 2):
        a = {k: v for k, v in full[step].items() if not k.startswith(timing)}
        b = {k: v for k, v in resumed[step].items() if not k.startswith(timing)}
        assert a == b, step


def test_warm_start_row_counts_each_seed_once(tmp_path):
    # 3 estimators x 3 seeds; step 0 is the same measurement for every estimator of
    # a seed, so the warm-start row must have n = 3 seeds, not n = 9 copies.
    step0 = {0: 0.1, 1: 0.4, 2: 0.7}
    for est in ("grpo", "gdpo", "gdpo_no_bn"):
        for seed, v in step0.items():
            d = tmp_path / "runs" / est / f"seed{seed}"
            d.mkdir(parents=True)
            recs = [{"step": 0, "eval/pass@1": v}, {"step": 2, "eval/pass@1": v + 0.05}]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
            (d / "run_info.json").write_text(json.dumps({"seconds": 1.0}))
    table = ce.report("math", str(tmp_path), ["grpo", "gdpo", "gdpo_no_bn"], [0, 1, 2], window=1)
    row = table["rows"]["warm start (step 0)"]["eval/pass@1"]
    assert row["n"] == 3
    assert row["mean"] == pytest.approx(0.4)
    assert row["std"] == pytest.approx(np.std([0.1, 0.4, 0.7], ddof=1))
    assert table["rows"]["gdpo"]["eval/pass@1"]["mean"] == pytest.approx(0.45)


# ------------------------------------------------------------ studies (issue 16)
def test_auc_bootstrap_paired_and_verdicts_by_hand():
    from experiments import compare_stats as cs

    # Trapezoid / step range: (0.1+0.3)/2*10 + (0.3+0.5)/2*10 = 6 over 20 steps -> 0.3.
    assert cs.auc([0, 10, 20], [0.1, 0.3, 0.5]) == pytest.approx(0.3)
    assert cs.auc([20, 0, 10], [0.5, 0.1, float("nan")]) == pytest.approx(0.3)  # sorted, NaN out
    assert cs.auc([5], [0.7]) == 0.7 and math.isnan(cs.auc([], []))
    lo, hi = cs.bootstrap_ci([1.0, 1.0, 1.0])
    assert lo == hi == 1.0
    # One seed has no spread: its interval is everything (it made any difference "held").
    assert cs.bootstrap_ci([0.01]) == cs.t_ci([0.01]) == (-math.inf, math.inf)
    lo, hi = cs.bootstrap_ci([0.0, 1.0, 2.0, 3.0, 4.0])
    assert 0.0 <= lo < 2.0 < hi <= 4.0
    # Reference: the same percentile bootstrap written out with NumPy.
    rng = np.random.default_rng(0)
    v = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    means = v[rng.integers(0, 5, size=(10000, 5))].mean(1)
    assert (lo, hi) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    d = cs.paired({0: 1.0, 1: 2.0, 2: 5.0}, {0: 0.5, 1: 2.5, 3: 9.0})
    assert d["seeds"] == [0, 1] and d["values"] == [0.5, -0.5] and d["mean"] == 0.0
    assert cs.verdict({"n": 3, "ci_lo": 0.1, "ci_hi": 0.4}) == "held"
    assert cs.verdict({"n": 3, "ci_lo": -0.4, "ci_hi": -0.1}) == "did not hold"
    assert cs.verdict({"n": 3, "ci_lo": -0.1, "ci_hi": 0.4}) == "inconclusive"
    # Two seeds are too few for a verdict, whatever their interval.
    assert cs.verdict({"n": 2, "ci_lo": 0.1, "ci_hi": 0.4}) == "inconclusive (n<3)"
    values = {"a": {"q": {0: 1.0, 1: 2.0, 2: 1.5}}, "b": {"q": {0: 0.0, 1: 0.5, 2: 0.25}}}
    preds = [
        {"id": "P1", "text": "a > b", "terms": [(1.0, "a", "q"), (-1.0, "b", "q")]},
        {
            "id": "P2",
            "text": "a > b + 2",
            "terms": [(1.0, "a", "q"), (-1.0, "b", "q")],
            "margin": 2,
        },
        {"id": "P3", "text": "both", "all_of": ["P1", "P2"]},
    ]
    got = {p["id"]: p for p in cs.judge(values, preds)}
    assert got["P1"]["verdict"] == "held" and got["P1"]["mean"] == pytest.approx(1.25)
    assert got["P2"]["verdict"] == "did not hold" and got["P3"]["verdict"] == "did not hold"
    assert got["P1"]["verdict_bootstrap"] == "held" and got["P3"]["verdict_bootstrap"]
    # A typo in all_of made the prediction hold on its other parts alone.
    with pytest.raises(ValueError, match=r"prediction P3: all_of names \['P9'\]"):
        cs.judge(values, preds[:2] + [dict(preds[2], all_of=["P1", "P9"])])


def test_t_interval_against_scipys_one_sample_test_and_its_coverage():
    from scipy import stats

    from experiments import compare_stats as cs

    v = [0.12, -0.03, 0.08, 0.2, 0.05, -0.01, 0.11, 0.07, 0.0, 0.09]
    ref = stats.ttest_1samp(v, 0.0).confidence_interval(0.95)
    assert cs.t_ci(v) == pytest.approx((ref.low, ref.high))
    assert cs.t_ci(v + [float("nan")]) == pytest.approx((ref.low, ref.high))  # dropped
    # 10 seeds, 2000 studies of a true mean 0: the t interval covers ~95 %, as labelled
    # (the percentile bootstrap's ~90 % is what made it the wrong label).
    rng = np.random.default_rng(0)
    draws = rng.normal(size=(2000, 10))
    cover = np.mean([lo < 0 < hi for lo, hi in map(cs.t_ci, draws)])
    assert 0.935 < cover < 0.965, cover
    # The docs' "about 90 %" of the percentile bootstrap at 10 seeds (500 studies).
    boot = [cs.bootstrap_ci(d, n_boot=1000, seed=i) for i, d in enumerate(draws[:500])]
    cover = np.mean([lo < 0 < hi for lo, hi in boot])
    assert 0.86 < cover < 0.93, cover


def test_p_values_and_holms_family_wise_verdicts():
    from scipy import stats

    from experiments import compare_stats as cs

    # The p-value is scipy's one-sample t test, and below 0.05 exactly where the 95 %
    # t interval excludes the margin (the verdict's rule), on 300 random samples.
    rng = np.random.default_rng(1)
    for i in range(300):
        v = rng.normal(0.3 * (i % 3), 1.0, size=3 + i % 8)
        m = float(rng.normal(0, 0.3))
        assert cs.t_pvalue(v, m) == pytest.approx(stats.ttest_1samp(v, m).pvalue, rel=1e-9)
        lo, hi = cs.t_ci(v)
        assert (cs.t_pvalue(v, m) < 0.05) == (not lo <= m <= hi)
    assert math.isnan(cs.t_pvalue([0.3])) and cs.t_pvalue([0.25, 0.25, 0.25], 0.0) == 0.0
    assert cs.t_pvalue([0.25, 0.25, 0.25], 0.25) == 1.0
    # Holm by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06,
    # 0.04 -> made non-decreasing 0.06; NaN stays and does not count in m.
    got = cs.holm([0.01, 0.04, float("nan"), 0.03, 0.005])
    assert got[:2] == pytest.approx([0.03, 0.06]) and math.isnan(got[2])
    assert got[3:] == pytest.approx([0.06, 0.02])
    assert cs.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    # Five predictions: P1 alone clears 95 % (p 0.02) but not the family-wise 5 %.
    a = {s: 0.0 for s in range(10)}
    strong = {s: 1.0 + 0.1 * (s % 3) for s in range(10)}
    weak = dict(enumerate([0.35, -0.2, 0.6, 0.1, 0.55, -0.1, 0.4, 0.25, 0.5, -0.15]))
    values = {"a": {"q": a, "z": a}, "b": {"q": weak, "s": strong, "z": a}}
    diff = [(1.0, "b", "q"), (-1.0, "a", "q")]
    preds = [
        {"id": "P1", "text": "weak", "terms": diff},
        {"id": "P2", "text": "strong", "terms": [(1.0, "b", "s")]},
        {"id": "P3", "text": "strong reversed", "terms": [(-1.0, "b", "s")]},
        {"id": "P4", "text": "none", "terms": [(1.0, "b", "z")]},
        {"id": "P5", "text": "P1 and P2", "all_of": ["P1", "P2"]},
    ]
    got = {p["id"]: p for p in cs.judge(values, preds)}
    p1 = stats.ttest_1samp(list(weak.values()), 0.0).pvalue
    assert got["P1"]["p_value"] == pytest.approx(p1) and 0.01 < p1 < 0.05
    assert got["P1"]["verdict"] == "held" and got["P1"]["verdict_holm"] == "inconclusive"
    assert got["P1"]["p_holm"] == pytest.approx(min(1.0, 2 * p1))  # third smallest of 3 finite
    assert got["P2"]["verdict_holm"] == "held" and got["P3"]["verdict_holm"] == "did not hold"
    assert math.isnan(got["P4"]["p_value"]) or got["P4"]["verdict_holm"] == "inconclusive"
    assert got["P5"]["verdict"] == "held" and got["P5"]["verdict_holm"] == "inconclusive"
    # Fewer than MIN_SEEDS seeds: no verdict, family-wise either.
    few = {
        e: {q: {s: x for s, x in v.items() if s < 2} for q, v in qs.items()}
        for e, qs in values.items()
    }
    assert cs.judge(few, preds[:1])[0]["verdict_holm"] == "inconclusive (n<3)"


def test_study_run_configs_differ_only_in_estimator_and_seed():
    from gdpo_jax.train.config import config_to_dict, validate_config

    for study in ce.STUDIES:
        a = ce.run_config(study, estimator="grpo", seed=0, workdir="/w", model="", quick=False)
        b = ce.run_config(study, estimator="gdpo", seed=7, workdir="/w", model="", quick=False)
        da, db = config_to_dict(a), config_to_dict(b)
        assert sorted(k for k in da if da[k] != db[k]) == ["algo", "seed"]
        assert {k for k in da["algo"] if da["algo"][k] != db["algo"][k]} == {"estimator"}
        validate_config(a, num_devices=1)
    three = ce.run_config(
        "three_binary", estimator="gdpo", seed=0, workdir="/w", model="", quick=False
    )
    assert three.algo.group_size == 8 and len(three.rewards.names) == 3
    assert ce.sft_config_name("three_binary") is None
    sft = ce.sft_config("format_cold", "/tmp/sft", quick=False)
    assert sft.sft.format_noise == 0.8  # most targets lack the tag structure


@pytest.mark.parametrize("study", ["three_binary", "format_cold", "format_cold_toy"])
def test_quick_study_writes_shares_cis_and_verdicts(tmp_path, study):
    out = tmp_path / study
    ests = ["grpo", "gdpo"]
    table = ce.run_comparison(study, out_dir=str(out), estimators=ests, seeds=[0], quick=True)
    from gdpo_jax.train.metrics import read_jsonl

    sec = table["study"]
    recs = read_jsonl(str(out / "runs" / "gdpo" / "seed0" / "metrics.jsonl"))
    for name in sec["rewards"]:
        v = recs[1][f"adv/share/{name}"]
        assert 0.0 <= v <= 1.0, (name, v)
        assert (out / "plots" / f"share_{name}.png").read_bytes()[:8] == PNG_MAGIC
    pair = sec["stats"]["paired"]["gdpo-grpo"]
    q = f"train_auc:{sec['rewards'][0]}"
    assert pair[q]["n"] == 1 and (pair[q]["ci_lo"], pair[q]["ci_hi"]) == (-math.inf, math.inf)
    ids = [p["id"] for p in sec["predictions"]]
    assert ids and all(p["verdict"] for p in sec["predictions"])
    assert any("no runs" in p["verdict"] for p in sec["predictions"])  # grpo_no_std not run
    md = (out / "results.md").read_text()
    assert "## Predictions" in md and "95 % t interval" in md and "bootstrap CI: verdict" in md
    # One seed per estimator: no verdict is reached.
    assert all(p["verdict"].startswith("inconclusive") for p in sec["predictions"])
    saved = json.loads((out / "results.json").read_text())
    assert saved["study"]["predictions"][0]["id"] == ids[0]


def test_committed_verdicts_are_current_and_reproduce_the_studies_own(tmp_path):
    # docs/results/verdicts.md re-judges the committed studies from their results.json:
    # a stale table is a bug, and its bootstrap verdicts must be the studies' own.
    from experiments import restat_studies

    results = os.path.join(os.path.dirname(__file__), "..", "docs", "results")
    result = restat_studies.write(results, str(tmp_path))
    with open(os.path.join(results, "verdicts.md")) as f:
        assert (tmp_path / "verdicts.md").read_text() == f.read()
    assert result["verdicts"], "no committed study found"
    for row in result["verdicts"]:
        with open(os.path.join(results, row["study"], "results.json")) as f:
            saved = json.load(f)
        own = {p["id"]: p for p in saved["study"]["predictions"]}[row["id"]]
        assert row["verdict_bootstrap"] == own["verdict"], (row["study"], row["id"])
        if "ci_lo" in own:
            assert (row["boot_lo"], row["boot_hi"]) == pytest.approx((own["ci_lo"], own["ci_hi"]))


def test_a_resumed_run_is_left_out_of_the_time_per_run():
    # A resumed run's clock covers only its last attempt: its seconds passed for a
    # whole run's in the reports' time-per-run tables.
    from experiments.compare_report import run_times

    infos = [
        {"seconds": 30.0, "cpu_s": 40.0, "resumed_from": 0},
        {"seconds": 12.9, "cpu_s": 18.1, "resumed_from": 8},
        {"seconds": 31.0},  # older run_info without the field: a whole run
    ]
    assert run_times(infos) == {"wall_s": [30.0, None, 31.0], "cpu_s": [40.0, None, None]}


def test_restat_refuses_a_results_dir_without_studies_before_writing(tmp_path):
    # An empty --results_dir replaced the committed verdicts.md (the --out_dir default)
    # with empty tables; a missing one was a traceback.
    from experiments import restat_studies

    out = tmp_path / "out"
    out.mkdir()
    (out / "verdicts.md").write_text("committed\n")
    (tmp_path / "empty").mkdir()
    for d in ("empty", "missing"):
        with pytest.raises(ValueError, match=f"--results_dir=.*{d}"):
            restat_studies.write(str(tmp_path / d), str(out))
    assert (out / "verdicts.md").read_text() == "committed\n"


def test_a_finished_run_of_other_settings_is_not_reused_and_reports_need_one_length(
    tmp_path, monkeypatch
):
    # A finished run in --out_dir was reused whatever it ran: a 60-step seed was paired
    # with 200-step ones, and the report's final_step (the max) hid it.
    from experiments import compare_report, compare_runs
    from gdpo_jax.train.config import ConfigError, fingerprint

    out = str(tmp_path / "study")
    kw = dict(out_dir=out, estimators=["grpo", "gdpo"], seeds=[0], quick=True)
    _, configs = compare_runs.prepare(
        "three_binary", sft_dir="", overrides=(), sft_overrides=(), variant="", **kw
    )
    cfg = configs[("gdpo", 0)]
    assert compare_runs.check_finished_run(cfg) is False  # nothing there yet
    os.makedirs(cfg.workdir)
    info = compare_runs.reuse_key(cfg)
    assert info["fingerprint"] == fingerprint(cfg)
    with open(os.path.join(cfg.workdir, "run_info.json"), "w") as f:
        json.dump(info, f)
    assert compare_runs.check_finished_run(cfg) is True  # the same run: reused
    with open(os.path.join(cfg.workdir, "run_info.json"), "w") as f:
        json.dump(dict(info, num_steps=cfg.train.num_steps + 5), f)
    with pytest.raises(ConfigError, match=r"holds a finished run of train\.num_steps=") as e:
        compare_runs.check_finished_run(cfg)
    assert "\n" not in str(e.value) and "--force" in str(e.value)
    # run_comparison stops before the warm start trains.
    monkeypatch.setattr(compare_runs, "warm_start", lambda *a, **k: pytest.fail("warm start"))
    with pytest.raises(ConfigError, match="holds a finished run"):
        compare_runs.run_comparison("three_binary", **kw)
    # The report refuses finished runs of different lengths, naming the short ones.
    for est, last in (("grpo", 4), ("gdpo", 2)):
        run = tmp_path / "mixed" / "runs" / est / "seed0"
        run.mkdir(parents=True)
        lines = [{"step": t, "eval/three_correct": 0.1} for t in range(last + 1)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        (run / "run_info.json").write_text(json.dumps({"seconds": 1.0}))
    with pytest.raises(ConfigError, match=r"end at different steps \(gdpo seed 0 at step 2;"):
        compare_report.report("three_binary", str(tmp_path / "mixed"), ["grpo", "gdpo"], [0])
