"""experiments/smollm2_demo.py: the summary of a run, on hand-made metrics.

The training run itself (15 minutes of CPU) is not run here; docs/results.md's
table is checked against the committed summary by tests/test_docs.py.
"""

from __future__ import annotations

import pytest

from experiments import smollm2_demo


def _rows() -> list[dict]:
    """6 steps: step s has iteration 10 + s seconds (the first 100), format s / 10,
    correctness -s, entropy 1 / s; held-out evals after steps 3 and 6."""
    rows = []
    for s in range(1, 7):
        r = {
            "step": s,
            "time/iter_s": 100.0 if s == 1 else 10.0 + s,
            "time/sample_s": 2.0,
            "time/step_s": 8.0 + s,
            "time/reward_s": 0.001,
            "reward/toolcall_format/mean": s / 10,
            "reward/toolcall_correctness/mean": -float(s),
            "entropy": 1.0 / s,
        }
        if s in (3, 6):
            r |= {"eval/format": s / 6, "eval/correctness": -s / 3, "eval/accuracy": 0.5}
        rows.append(r)
    return rows


def test_summarize_hand_worked():
    eval0 = {"eval/format": 0.25, "eval/correctness": -3.0, "eval/accuracy": 0.0}
    s = smollm2_demo.summarize(_rows(), eval0, wall_s=600.0)
    # Medians over steps 2-6: iterations 12..16 -> 14; train step 10..14 -> 12.
    assert s["steps"] == 6 and s["iter_s"] == 14.0 and s["step_s"] == 12.0
    assert s["first_step_extra_s"] == 86.0
    # Windows of 5 steps: 1-5 and 6-6.
    assert [w["steps"] for w in s["windows"]] == ["1-5", "6-6"]
    assert s["windows"][0]["toolcall_format"] == pytest.approx(0.3)  # mean of .1 ... .5
    assert s["windows"][1]["toolcall_correctness"] == -6.0
    assert list(s["evals"]) == ["0", "3", "6"]
    assert s["evals"]["0"]["format"] == 0.25 and s["evals"]["6"]["correctness"] == -2.0
    assert s["entropy_first_last"] == [1.0, pytest.approx(1 / 6)]

    table = smollm2_demo.render(s, "Some CPU (avx2), 2 cores")
    assert (
        "| cost per RL step (median of steps 2-6) | 14.0 s (sample 2.0 s, train step 12.0 s"
        in table
    )
    assert "| first step | adds 86 s (compilation) |" in table
    assert "| 6 steps, evals included | 10.0 min |" in table
    assert "| sampled format reward, steps 1-5 / 6-6 | 0.30 / 0.60 |" in table
    assert "steps 0 -> 3 -> 6 | format 0.25 -> 0.50 -> 1.00;" in table
    assert "| policy entropy, step 1 -> 6 | 1.00 -> 0.17 |" in table
    assert table.endswith("Some CPU (avx2), 2 cores; one run, seed 0.")
