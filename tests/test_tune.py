"""The micro-batch tuner (gdpo_jax/train/tune.py, experiments/tune_microbatches.py).

Timings are not asserted (they belong to benchmarks/): what is checked is that
every valid count's step runs on the synthetic batch, the invalid count is
skipped with the validation message, the fastest is the smallest median of what
was measured, and the CLI prints and writes the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tests._train_fixtures  # noqa: F401 - registers the tiny task, tokenizer and rewards
from tests._subprocess import child_env
from tests._train_fixtures import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_synthetic_batch_has_the_config_shapes_and_shared_group_prompts(tmp_path):
    from gdpo_jax.train.tune import synthetic_batch

    c = tiny_config(str(tmp_path))
    b = synthetic_batch(c, prompts=3, vocab_size=32)
    n, p, k = 3 * c.algo.group_size, c.sampling.max_prompt_len, c.sampling.max_new_tokens
    assert b["prompt_ids"].shape == b["prompt_mask"].shape == (n, p)
    assert b["completion_ids"].shape == b["old_logp"].shape == b["ref_logp"].shape == (n, k)
    assert b["rewards"].shape == (n, len(c.rewards.names)) and b["valid"].all()
    assert b["completion_mask"].all() and b["prompt_mask"].all()  # the widest shapes
    g = c.algo.group_size
    groups = b["prompt_ids"].reshape(3, g, p)
    assert (groups == groups[:, :1]).all()  # a group's rows read one prompt
    assert not (groups[0, 0] == groups[1, 0]).all()
    np.testing.assert_array_equal(b["group_ids"], np.repeat(np.arange(3), g))
    for key in ("prompt_ids", "completion_ids"):
        assert 6 <= b[key].min() and b[key].max() < 32


def test_time_microbatches_runs_each_valid_count_and_skips_the_invalid(tmp_path):
    from gdpo_jax.train.tune import time_microbatches

    c = tiny_config(str(tmp_path))  # 4 prompts x G 4 = 16 rows on one device
    c.algo.share_prompt = True
    logs: list[str] = []
    res = time_microbatches(c, (1, 2, 3, 2), steps=2, log=logs.append)
    counts = res["counts"]
    assert list(counts) == [1, 2, 3]  # unique, in order
    assert counts[3]["status"] == "invalid" and "num_microbatches" in counts[3]["reason"]
    for k in (1, 2):
        r = counts[k]
        assert r["status"] == "ok" and len(r["times_s"]) == 2
        assert r["median_s"] > 0 and r["best_s"] == min(r["times_s"]) and r["compile_s"] > 0
        assert r["share_prompt"]  # 4 prompts split into whole groups at 1 and 2 blocks
    assert res["fastest"] == min((1, 2), key=lambda k: counts[k]["median_s"])
    assert res["rows"] == 16 and res["config_count"] == c.algo.num_microbatches
    assert res["prompt_len"] == c.sampling.max_prompt_len  # the widest bucket by default
    assert any("skipped" in line for line in logs)


def test_prompt_len_times_a_shorter_bucket_and_rejects_other_widths(tmp_path, monkeypatch):
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.train import tune

    c = tiny_config(str(tmp_path))
    c.sampling.prompt_buckets = (4, 8)
    with pytest.raises(ConfigError, match=r"prompt_len=5 is not one of .*\(4, 8\)"):
        tune.time_microbatches(c, (1,), steps=1, prompt_len=5)
    widths = []  # the prompt width of each batch the timer builds

    def spy(*args, **kwargs):
        arrays = synthetic_batch(*args, **kwargs)
        widths.append(arrays["prompt_ids"].shape[1])
        return arrays

    synthetic_batch = tune.synthetic_batch
    monkeypatch.setattr(tune, "synthetic_batch", spy)
    res = tune.time_microbatches(c, (1,), steps=1, prompt_len=4)
    assert res["prompt_len"] == 4 and res["counts"][1]["status"] == "ok"
    assert widths and set(widths) == {4}  # the timed batch is the short bucket's width


def test_time_microbatches_rejects_empty_counts_and_zero_steps(tmp_path):
    from gdpo_jax.train.tune import time_microbatches

    c = tiny_config(str(tmp_path))
    with pytest.raises(ValueError, match="steps=0"):
        time_microbatches(c, (1,), steps=0)
    with pytest.raises(ValueError, match="counts is empty"):
        time_microbatches(c, (), steps=1)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = child_env(GDPO_JAX_NO_RELAUNCH="1")
    return subprocess.run(
        [sys.executable, "-m", "experiments.tune_microbatches", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_cli_prints_the_fastest_and_writes_json(tmp_path):
    out = tmp_path / "tune.json"
    r = _cli(
        "--config=configs/tiny_cpu.py",
        "--config.algo.num_prompts=4",
        "--config.sampling.max_prompt_len=8",
        "--counts=1,2",
        "--steps=1",
        f"--json={out}",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    medians = {int(k): v["median_s"] for k, v in res["counts"].items() if v["status"] == "ok"}
    assert set(medians) == {1, 2} and res["fastest"] == min(medians, key=medians.get)
    assert f"fastest: --config.algo.num_microbatches={res['fastest']}" in r.stdout
    assert "| num_microbatches |" in r.stdout


def test_cli_bad_counts_is_one_line(tmp_path):
    r = _cli("--config=configs/tiny_cpu.py", "--counts=0,2")
    assert r.returncode != 0 and "counts must be >= 1" in r.stderr
