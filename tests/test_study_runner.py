"""experiments/compare_runs.py's checks before a comparison trains (reuse, resume, warm
start) and its writes surviving a kill; nothing here trains a model."""

import json
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments import compare_estimators as ce  # noqa: E402
from experiments import compare_runs  # noqa: E402
from gdpo_jax.train.config import ConfigError  # noqa: E402


def _prepare(out, task="three_binary", **kw):
    args = dict(
        out_dir=str(out),
        estimators=["grpo", "gdpo"],
        seeds=[0],
        quick=True,
        sft_dir="",
        overrides=(),
        sft_overrides=(),
        variant="",
    )
    args.update(kw)
    return compare_runs.prepare(task, **args)


def _checkpoint(cfg, step):
    """A checkpoint of `cfg`'s run at `step` (a stand-in state: only its meta is read)."""
    import jax
    import jax.numpy as jnp

    from gdpo_jax.train.checkpoint import Checkpointer

    ckpt = Checkpointer.from_config(cfg)
    ckpt.save(step, {"w": jnp.zeros(2)}, key=jax.random.key(0), force=True)
    ckpt.close()


def _one_line(e):
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


def test_a_finished_run_needs_the_same_eval_schedule_and_a_recorded_fingerprint(tmp_path):
    # A run_info.json without a fingerprint (an older version) was reused under any
    # config, and one of another eval schedule was mixed into the table.
    _, configs = _prepare(tmp_path)
    cfg = configs[("gdpo", 0)]
    os.makedirs(cfg.workdir)
    path = os.path.join(cfg.workdir, "run_info.json")
    key = compare_runs.reuse_key(cfg)
    assert key["eval_every"] == cfg.train.eval_every
    with open(path, "w") as f:
        json.dump(key, f)
    assert compare_runs.check_finished_run(cfg) is True
    for changed, named in (
        ({k: v for k, v in key.items() if k != "fingerprint"}, "config fingerprint=not recorded"),
        (dict(key, eval_every=cfg.train.eval_every + 1), "train.eval_every="),
        (dict(key, eval_num_examples=3), "train.eval_num_examples=3"),
    ):
        with open(path, "w") as f:
            json.dump(changed, f)
        with pytest.raises(ConfigError, match="holds a finished run of") as e:
            compare_runs.check_finished_run(cfg)
        assert named in _one_line(e) and "--force" in str(e.value)


def test_a_run_recording_its_config_survives_a_field_added_to_the_schema(tmp_path):
    """The fingerprint hashes every field: a field added to the config schema (as
    optim.decay_mask was) made every finished run another config's. A run_info.json
    holding the run's config is compared field by field (a field it lacks reads as its
    default), and a real difference is still named."""
    from gdpo_jax.train.config import config_to_dict

    _, configs = _prepare(tmp_path)
    cfg = configs[("gdpo", 0)]
    os.makedirs(cfg.workdir)
    path = os.path.join(cfg.workdir, "run_info.json")
    old = config_to_dict(cfg)
    del old["optim"]["decay_mask"]  # written before the field existed
    info = dict(compare_runs.reuse_key(cfg), fingerprint="from-an-older-schema", config=old)
    with open(path, "w") as f:
        json.dump(info, f)
    assert compare_runs.check_finished_run(cfg) is True
    old["optim"]["lr"] = cfg.optim.lr * 2
    with open(path, "w") as f:
        json.dump(dict(info, config=old), f)
    with pytest.raises(ConfigError, match=r"holds a finished run of other optim\.lr"):
        compare_runs.check_finished_run(cfg)


def test_a_run_info_cut_by_a_kill_is_an_unfinished_run(tmp_path):
    # An empty run_info.json (killed mid-write) was a JSONDecodeError on every rerun.
    _, configs = _prepare(tmp_path)
    cfg = configs[("gdpo", 0)]
    os.makedirs(cfg.workdir)
    with open(os.path.join(cfg.workdir, "run_info.json"), "w") as f:
        f.write('{"num_st')
    assert compare_runs.check_finished_run(cfg) is False
    (tmp_path / "runs" / "gdpo" / "seed0" / "metrics.jsonl").write_text('{"step": 0}\n')
    assert ce.load_runs(str(tmp_path), ["gdpo"], [0]) == {}  # nor reported as finished


class _FakeTrainer:
    """run_one's Trainer without a model: resumes from `start`, returns `final`."""

    start, final = 0, {}

    def __init__(self, cfg):
        self.start_step = self.start

    def evaluate(self):
        return {"eval/three_short": 0.5}

    def run(self):
        return self.final


def test_run_one_writes_run_info_atomically_and_a_restart_drops_old_rows(tmp_path, monkeypatch):
    from gdpo_jax.train import loop
    from gdpo_jax.train.metrics import read_jsonl

    monkeypatch.setattr(loop, "Trainer", _FakeTrainer)
    _, configs = _prepare(tmp_path)
    cfg = configs[("gdpo", 0)]
    os.makedirs(cfg.workdir)
    # Killed before its first checkpoint: the rows of that attempt, step 0 among them.
    metrics = os.path.join(cfg.workdir, "metrics.jsonl")
    with open(metrics, "w") as f:
        f.write('{"step": 0, "eval/three_short": 0.1}\n{"step": 1, "loss": 2.0}\n')
    info = compare_runs.run_one(cfg)
    assert info["done"] and info["eval_every"] == cfg.train.eval_every
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    assert rows == [{"step": 0, "eval/three_short": 0.5}]
    assert compare_runs.check_finished_run(cfg) is True
    # A write that fails half way (here: a value JSON cannot hold) leaves the old file.
    path = os.path.join(cfg.workdir, "run_info.json")
    before = open(path).read()
    monkeypatch.setattr(_FakeTrainer, "start", 1)
    monkeypatch.setattr(_FakeTrainer, "final", {"loss": object()})
    with pytest.raises(TypeError):
        compare_runs.run_one(cfg)
    assert open(path).read() == before and sorted(read_jsonl(metrics)) == [0]


def test_report_only_survives_a_results_json_cut_by_a_kill(tmp_path):
    # --report_only read the old results.json after report() had rewritten results.md:
    # a JSONDecodeError traceback, and results.json stayed cut.
    for seed in (0, 1):
        d = tmp_path / "runs" / "grpo" / f"seed{seed}"
        d.mkdir(parents=True)
        recs = [{"step": 0, "eval/pass@1": 0.1}, {"step": 2, "eval/pass@1": 0.3 + seed}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (d / "run_info.json").write_text(json.dumps({"seconds": 1.0}))
    results = tmp_path / "results.json"
    results.write_text('{"task": "math", "total_seconds": 12.0, "rows": {"gr')
    table = ce.report_only("math", str(tmp_path), ["grpo"], [0, 1], window=1)
    saved = json.loads(results.read_text())
    assert saved["total_seconds"] is None and saved["rows"] == json.loads(json.dumps(table["rows"]))
    assert saved["rows"]["grpo"]["eval/pass@1"]["mean"] == pytest.approx((0.3 + 1.3) / 2)
    results.write_text(json.dumps({"total_seconds": 12.0}))
    ce.report_only("math", str(tmp_path), ["grpo"], [0, 1], window=1)
    assert json.loads(results.read_text())["total_seconds"] == 12.0  # kept


def test_a_duplicate_estimator_is_refused(tmp_path):
    # --estimators=grpo,grpo trained the same run twice, into one directory.
    with pytest.raises(ConfigError, match=r"--estimators names \['grpo'\] more than once") as e:
        _prepare(tmp_path, estimators=["grpo", "gdpo", "grpo"])
    _one_line(e)


def test_a_killed_run_that_cannot_resume_is_refused_before_anything_trains(tmp_path):
    # Found at the run's turn, an incompatible checkpoint ended the study with a
    # traceback after the runs before it had trained; one past the new num_steps was
    # recorded as a finished run with metrics past its end.
    _, configs = _prepare(tmp_path, overrides=[("optim.lr", "1e-5")])
    cfg = configs[("gdpo", 0)]
    _, theirs = _prepare(tmp_path)
    _checkpoint(theirs[("gdpo", 0)], 1)
    with pytest.raises(ConfigError, match=r"^gdpo seed 0: .*optim\.lr") as e:
        _prepare(tmp_path, overrides=[("optim.lr", "1e-5")])
    assert "--force" in _one_line(e) and "--config.checkpoint.allow_config_change" in str(e.value)
    _prepare(tmp_path, overrides=[("optim.lr", "1e-5")], force=True)  # starts it over
    _prepare(tmp_path)  # the run's own config resumes it

    _checkpoint(theirs[("grpo", 0)], cfg.train.num_steps + 1)
    with pytest.raises(ConfigError, match=r"^grpo seed 0: .* at step (\d+), past") as e:
        _prepare(tmp_path)
    assert f"--config.train.num_steps>={cfg.train.num_steps + 1}" in _one_line(e)


def test_the_warm_start_must_match_the_sft_flags(tmp_path):
    # A finished warm start was reused whatever --sft_config.* said; a killed one of
    # other settings was a traceback naming --config.checkpoint.allow_config_change.
    from gdpo_jax.train import logs

    sft_dir = str(tmp_path / "sft")
    sft = compare_runs.sft_config("format_cold", sft_dir, quick=True)
    _checkpoint(compare_runs.sft_config("format_cold", sft_dir, quick=True), 1)
    steps = [("sft.num_steps", str(sft.sft.num_steps + 1))]
    with pytest.raises(ConfigError, match="^warm start: .*sft.num_steps") as e:
        _prepare(tmp_path, task="format_cold", sft_overrides=steps)
    assert "--sft_config.checkpoint.allow_config_change" in _one_line(e)
    assert "--sft_dir" in str(e.value)
    _prepare(tmp_path, task="format_cold")  # the same settings resume it

    os.makedirs(os.path.join(sft_dir, "hf"))
    open(os.path.join(sft_dir, "hf", "config.json"), "w").write("{}")
    logs.save_config(sft)
    with pytest.raises(ConfigError, match=r"^--sft_config: .*\bsft\.num_steps\b") as e:
        _prepare(tmp_path, task="format_cold", sft_overrides=steps)
    assert "--sft_dir" in _one_line(e)
    model, _ = _prepare(tmp_path, task="format_cold")
    assert model == os.path.join(sft_dir, "hf")


def test_a_nan_at_either_end_of_a_curve_makes_its_auc_nan():
    # A NaN final eval was dropped and the AUC normalised over the shorter range: the
    # seed's area passed for a whole run's.
    from experiments.compare_stats import auc

    nan = float("nan")
    assert math.isnan(auc([0, 10, 20], [0.1, 0.3, nan]))
    assert math.isnan(auc([0, 10, 20], [nan, 0.3, 0.5]))
    # Inside the curve the trapezoid bridges it: (0.1 + 0.5) / 2 over 0..20.
    assert auc([0, 10, 20], [0.1, nan, 0.5]) == pytest.approx(0.3)


def test_restat_names_a_results_json_cut_by_a_kill(tmp_path):
    from experiments import restat_studies

    (tmp_path / "three_binary").mkdir()
    (tmp_path / "three_binary" / "results.json").write_text('{"task": "thr')
    with pytest.raises(ValueError, match=r"three_binary/results\.json is not JSON") as e:
        restat_studies.write(str(tmp_path), str(tmp_path / "out"))
    _one_line(e)


def test_a_study_of_one_estimator_says_it_has_no_pairs():
    from experiments.study_report import study_markdown

    s = {"n": 1, "median": 0.5, "q25": 0.5, "q75": 0.5}
    section = {
        "stats": {
            "quantities": ["final:x"],
            "per_estimator": {"gdpo": {"final:x": s}},
            "paired": {},
        },
        "predictions": [],
    }
    md = study_markdown(section)
    assert "None: no pair of the study's estimators ran" in md
    assert "| quantity |  |" not in md and "\n|---|\n" not in md
